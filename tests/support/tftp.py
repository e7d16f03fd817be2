"""A TFTP test client (our codec, the sans-IO FakeClient) and a lossy UDP proxy, on trio.

Both use real loopback sockets on the real clock: the server's shell reads its
sockets directly, so a fake network cannot stand in for the kernel. Every wait is
bounded (``trio.fail_after``); nothing sleeps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import trio

from plugins.tftp.packets import Opcode, encode_request
from tests.unit.tftp.fakeclient import FakeClient

Address = tuple[str, int]
RECV = 70_000


@dataclass
class Fetched:
    data: bytes
    complete: bool
    oack: dict[str, str] | None
    error: tuple[int, str] | None
    server_tid: Address | None
    datagrams: int  # received from the server


async def fetch(
    server: Address,
    name: str,
    options: dict[str, str] | None = None,
    *,
    mode: str = "octet",
    timeout: float = 0.2,
    dally: float = 0.0,
    limit: float = 30.0,
    sock: trio.socket.SocketType | None = None,
) -> Fetched:
    """Read ``name``; the RRQ is resent on a timeout until the server answers.
    After the last block the client stays ``dally`` seconds to re-ACK a resent one."""
    options = options or {}
    blksize = int(options.get("blksize", 512))
    windowsize = int(options.get("windowsize", 1))
    own = sock is None
    if sock is None:
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        await sock.bind(("127.0.0.1", 0))
    rrq = encode_request(Opcode.RRQ, name, mode, options)
    client = FakeClient(blksize, windowsize, timeout)
    t0 = trio.current_time()
    tid: Address | None = None
    try:
        with trio.fail_after(limit):
            await sock.sendto(rrq, server)
            while client.error is None:
                if client.complete and not dally:
                    break
                now = trio.current_time() - t0
                deadline = client.timer if not client.complete else now + dally
                with trio.move_on_at(t0 + deadline) as scope:
                    data, sender = await sock.recvfrom(RECV)
                if scope.cancelled_caught:
                    if client.complete:
                        break
                    if tid is None:
                        await sock.sendto(rrq, server)
                        client.timer = now + timeout
                    else:
                        client.handle_timer(now)
                else:
                    if tid is None:
                        tid = sender
                    elif sender != tid:
                        continue
                    client.receive(data, trio.current_time() - t0)
                    if client.oack and "blksize" in client.oack:
                        client.blksize = int(client.oack["blksize"])
                for ack in client.take():
                    await sock.sendto(ack, tid)
    finally:
        if own:
            sock.close()
    error = (client.error.code, client.error.message) if client.error else None
    return Fetched(bytes(client.data), client.complete, client.oack, error, tid, client.received)


@dataclass
class Faults:
    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0  # held back until the next datagram in the same direction passes
    seed: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {"drop": 0, "dup": 0, "reorder": 0})


class LossyProxy:
    """Stands between one client and the server: the client talks to ``address``;
    datagrams both ways are dropped, duplicated and reordered as ``faults`` says."""

    def __init__(self, server: Address, faults: Faults) -> None:
        self.server = server
        self.faults = faults
        self.rng = random.Random(faults.seed)
        self.front = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        self.back = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        self.client: Address | None = None
        self.server_tid: Address | None = None
        self.address: Address = ("127.0.0.1", 0)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.front.bind(("127.0.0.1", 0))
        await self.back.bind(("127.0.0.1", 0))
        self.address = self.front.getsockname()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, self.front, True)
                nursery.start_soon(self._pump, self.back, False)
                task_status.started(self.address)
        finally:
            self.front.close()
            self.back.close()

    async def _pump(self, sock, from_client: bool) -> None:
        held: tuple[bytes, Address] | None = None  # with where it was going when held
        while True:
            data, sender = await sock.recvfrom(RECV)
            if from_client:
                self.client = sender
                # A request (resent when its answer was lost) goes to the server's own
                # port, never to a transfer's: that one would take it for a stray.
                is_request = data[:2] in (b"\x00\x01", b"\x00\x02")
                out, to = self.back, (self.server if is_request else self.server_tid or self.server)
            else:
                if sender != self.server:
                    self.server_tid = sender
                out, to = self.front, self.client
            f, rng = self.faults, self.rng
            if rng.random() < f.drop:
                f.counts["drop"] += 1
                continue
            copies = [(data, to)]
            if rng.random() < f.dup:
                f.counts["dup"] += 1
                copies.append((data, to))
            if held is None and rng.random() < f.reorder:
                f.counts["reorder"] += 1
                held = (data, to)
                continue
            if held is not None:
                copies.append(held)  # the held datagram now arrives after a later one
                held = None
            for copy, dest in copies:
                await out.sendto(copy, dest)
