"""Admission in the shell (plugins/tftp/admission.py applied by server.py) on loopback:
a flood from one address, its requests waiting their turn, eviction for a poorer
source, and every request answered (a symlink swapped under the resolver, a bug).

Loopback's 127/8 stands in for a rack: each client binds its own address. The real
clock drives these, every wait is bounded (trio.fail_after, move_on_after).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from plugins.tftp import server as server_module
from plugins.tftp.packets import (
    Data,
    Error,
    ErrorCode,
    Opcode,
    encode_ack,
    encode_request,
    parse_untrusted,
)
from tests.support.tftp import fetch
from tests.trio.test_tftp_server import root, start  # noqa: F401 (fixture)

UDP = trio.socket.SOCK_DGRAM
REPO = Path(__file__).resolve().parents[2]


async def bound_socket(address: str) -> trio.socket.SocketType:
    sock = trio.socket.socket(trio.socket.AF_INET, UDP)
    await sock.bind((address, 0))
    return sock


def drain(sock: trio.socket.SocketType) -> list[bytes]:
    """The datagrams ``sock`` holds now (non-blocking reads, at most a buffer's worth)."""
    got = []
    for _ in range(10_000):
        try:
            got.append(os.read(sock.fileno(), 70_000))
        except BlockingIOError:
            break
    return got


async def test_a_flood_from_one_address_leaves_others_served_without_amplification(root):  # noqa: F811
    """The issue: requests from 300 ports of one address, never acknowledged, in 0.3 s.
    It holds 4 transfers; 64 wait; the rest get an ERROR no longer than their request.
    A client on another address is served at once, in full."""
    flood = [await bound_socket("127.0.2.1") for _ in range(300)]
    rrq = encode_request(Opcode.RRQ, "big.bin", "octet")
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                server, addr = await start(nursery, root, timeout=1.0, max_timeout=2.0)
                for sock in flood:
                    await sock.sendto(rrq, addr)
                    await trio.sleep(0.001)
                with trio.socket.socket(trio.socket.AF_INET, UDP) as sock:
                    await sock.bind(("127.0.2.2", 0))
                    with trio.fail_after(5):
                        got = await fetch(addr, "big.bin", {"blksize": "1468"}, sock=sock)
                assert got.complete and got.data == (root / "big.bin").read_bytes()
                await trio.sleep(0.2)  # the flood's last answers arrive
                stats = server.stats
                assert stats.refusals["per_source"] == 300 - 4 - 64
                assert stats.waiting == 64 and stats.active == 4
                answers = [drain(sock) for sock in flood]
                got_data = [a for a in answers if any(d[:2] == b"\x00\x03" for d in a)]
                assert len(got_data) == 4  # DATA only to the source's 4 transfers
                for a in answers:
                    if a not in got_data:
                        assert sum(len(d) for d in a) <= len(rrq)  # never more than it sent
                nursery.cancel_scope.cancel()
    finally:
        for sock in flood:
            sock.close()


async def test_one_address_asking_for_many_files_is_served_without_refusal(root):  # noqa: F811
    """A host behind NAT, or a test rig: past 4 unacknowledged transfers its requests
    wait (briefly: until its clients acknowledge), none is refused."""

    async def one(i: int) -> bytes:
        got = await fetch(addr, "mid.bin", {"blksize": "1468"}, timeout=0.5, limit=30)
        return got.data

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, timeout=1.0)
            results = []

            async def keep(i):
                results.append(await one(i))

            async with trio.open_nursery() as clients:
                for i in range(20):
                    clients.start_soon(keep, i)
            assert results == [(root / "mid.bin").read_bytes()] * 20
            await server.wait_idle()  # the last final ACK is on its way
            assert server.stats.transfers["complete"] == 20 and server.stats.transfers["busy"] == 0
            nursery.cancel_scope.cancel()


async def test_a_full_table_evicts_the_unverified_transfer_of_the_richest_source(root):  # noqa: F811
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, max_transfers=3, timeout=2.0)
            hog = [await bound_socket("127.0.3.1") for _ in range(3)]
            try:
                for sock in hog:
                    await sock.sendto(encode_request(Opcode.RRQ, "big.bin", "octet"), addr)
                    await sock.recvfrom(70_000)  # DATA 1, never acknowledged
                with trio.socket.socket(trio.socket.AF_INET, UDP) as sock:
                    await sock.bind(("127.0.3.2", 0))
                    got = await fetch(addr, "mid.bin", sock=sock)
                assert got.complete and got.data == (root / "mid.bin").read_bytes()
                assert server.stats.transfers["evicted"] == 1
                with trio.move_on_after(0.3):  # the evicted one hears nothing more (no ERROR)
                    await hog[0].recvfrom(70_000)
                    pytest.fail("an unverified, evicted source was sent something")
            finally:
                for sock in hog:
                    sock.close()
            nursery.cancel_scope.cancel()


async def test_an_evicted_verified_client_is_told(root):  # noqa: F811
    """Two progressing transfers from one address, a full table, and a newcomer from
    another: the older progressing one is taken (2 vs 0) and its client gets ERROR 0."""
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, max_transfers=2, timeout=2.0)
            hog = [await bound_socket("127.0.4.1") for _ in range(2)]
            try:
                for sock in hog:
                    await sock.sendto(encode_request(Opcode.RRQ, "big.bin", "octet"), addr)
                    first, tid = await sock.recvfrom(70_000)
                    assert parse_untrusted(first) == Data(1, first[4:])
                    await sock.sendto(encode_ack(1), tid)  # verified
                    await sock.recvfrom(70_000)  # DATA 2, then it stalls
                with trio.socket.socket(trio.socket.AF_INET, UDP) as sock:
                    await sock.bind(("127.0.4.2", 0))
                    got = await fetch(addr, "small.txt", sock=sock)
                assert got.complete
                # A stalled transfer retransmits its DATA 2 every 2 s (a slow run may see
                # one before the eviction): what ends it must be the ERROR.
                answer = parse_untrusted((await hog[0].recvfrom(70_000))[0])
                while isinstance(answer, Data):
                    answer = parse_untrusted((await hog[0].recvfrom(70_000))[0])
                assert answer == Error(ErrorCode.NOT_DEFINED, "server busy, try again later")
                assert server.stats.transfers["evicted"] == 1
            finally:
                for sock in hog:
                    sock.close()
            nursery.cancel_scope.cancel()


async def first_answer(addr, packet: bytes, source: str, wait: float):
    with trio.socket.socket(trio.socket.AF_INET, UDP) as sock:
        await sock.bind((source, 0))
        await sock.sendto(packet, addr)
        with trio.move_on_after(wait):
            data, _ = await sock.recvfrom(70_000)
            return parse_untrusted(data)
    return None


FLIPPER = (
    "import sys, threading; from pathlib import Path; "
    "from tests.unit.test_confine import flip_forever; "
    "flip_forever(Path(sys.argv[1]), threading.Event(), float(sys.argv[2]))"
)


async def test_every_request_is_answered_while_a_symlink_is_swapped(tmp_path: Path):
    """The resolver racing `ln -sfn` (appliance/confine.py): each request gets DATA or
    ERROR 1/2, none is left without an answer (before the fix: silence, or ERROR 0).
    The link flips in another process, so no GIL hand-over paces the race."""
    served = tmp_path / "root"
    (served / "boot").mkdir(parents=True)
    (served / "boot" / "pxelinux.0").write_bytes(b"pxe" * 100)
    flipper = subprocess.Popen([sys.executable, "-c", FLIPPER, str(served / "cur"), "20"], cwd=REPO)
    answers: dict[str, int] = {}
    rrq = encode_request(Opcode.RRQ, "cur/pxelinux.0", "octet")

    async def ask_many(addr, worker: int, until: float) -> None:
        for i in range(worker, 4000, 8):
            if trio.current_time() > until:
                return
            # Each request from its own address: the per-source limit stays out of it.
            got = await first_answer(addr, rrq, f"127.5.{i // 250}.{i % 250 + 1}", wait=2.0)
            kind = "silence" if got is None else type(got).__name__
            if isinstance(got, Error):
                kind = f"ERROR {got.code}"
            answers[kind] = answers.get(kind, 0) + 1

    try:
        with trio.fail_after(25):
            async with trio.open_nursery() as nursery:
                _, addr = await start(nursery, served)
                until = trio.current_time() + 3.0
                async with trio.open_nursery() as workers:
                    for worker in range(8):
                        workers.start_soon(ask_many, addr, worker, until)
                nursery.cancel_scope.cancel()
    finally:
        flipper.terminate()
        flipper.wait(timeout=10)
    assert "silence" not in answers, answers
    assert set(answers) <= {"Data", "ERROR 1", "ERROR 2"}, answers


async def test_a_bug_while_starting_a_transfer_is_answered_with_error_0(root, monkeypatch):  # noqa: F811
    def broken(*args, **kwargs):
        raise RuntimeError("bug")

    monkeypatch.setattr(server_module, "negotiate", broken)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root)
            rrq = encode_request(Opcode.RRQ, "small.txt", "octet")
            got = await first_answer(addr, rrq, "127.0.0.1", wait=2.0)
            assert got == Error(ErrorCode.NOT_DEFINED, "small.txt: server error")
            assert server.stats.transfers["failed"] == 1 and server.stats.active == 0
            nursery.cancel_scope.cancel()
