"""The TFTP data path (one pump thread for every transfer) on real loopback sockets.

Shutdown with transfers in flight, the ``max_transfers`` bound across the thread
hand-over, a window far larger than the client's buffer, refills from a worker
thread, a file that shrinks mid-transfer, many lossy transfers at once (many clean
ones: test_tftp_server.py). Bounded by ``trio.fail_after``; no timing is asserted.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import trio

from plugins.tftp.packets import Data, Error, Opcode, encode_ack, encode_request, parse_untrusted
from plugins.tftp.server import ServerConfig, TftpServer
from plugins.tftp.stats import Stats
from tests.support.tftp import Faults, LossyProxy, fetch
from tests.unit.tftp.fakeclient import pattern

FAST = {"timeout": 0.05, "max_timeout": 0.2, "retries": 4}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    (root / "big.bin").write_bytes(pattern(0, 300_000))
    (root / "mid.bin").write_bytes(pattern(3, 64 * 1024))
    (root / "large.bin").write_bytes(os.urandom(3 << 20))  # past one 1 MiB read-ahead chunk
    return root


async def start(nursery, root: Path, **overrides) -> tuple[TftpServer, tuple]:
    config = ServerConfig(root=root, port=0, **{**FAST, **overrides})
    server = TftpServer(config, Stats())
    bound = await nursery.start(server.serve)
    return server, bound[0]


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def pump_running() -> bool:
    return any(t.name == "tftp-pump" for t in threading.enumerate())


async def stall(
    addr, name: str = "big.bin", source: str = "127.0.0.1"
) -> tuple[trio.socket.SocketType, tuple]:
    """Ask for ``name`` and take DATA 1 without ever acknowledging it: the slot stays taken."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind((source, 0))
    await sock.sendto(encode_request(Opcode.RRQ, name, "octet"), addr)
    data, tid = await sock.recvfrom(70_000)
    assert parse_untrusted(data).block == 1
    return sock, tid


async def test_cancelling_serve_stops_the_thread_and_closes_every_transfer(root):
    before = open_fds()
    clients = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            # Long timeouts: nothing ends by itself while the test cancels.
            server, addr = await start(nursery, root, timeout=30.0, max_timeout=30.0)
            for i in range(5):  # five machines (one source holds at most 4)
                clients.append(await stall(addr, source=f"127.0.6.{i + 1}"))
            assert pump_running()  # it sent those DATA 1
            # One more moving along in a task, cancelled mid-transfer.
            nursery.start_soon(fetch, addr, "large.bin", {"blksize": "512"})
            await trio.sleep(0.05)
            assert server.stats.active >= 5
            nursery.cancel_scope.cancel()
    assert not pump_running()
    assert server.stats.active == 0 and not server._jobs
    assert server.stats.transfers["complete"] == 0  # none was counted as finished
    tids = [tid for _, tid in clients]
    for sock, _ in clients:
        sock.close()
    # Every transfer socket, file and the loop's own descriptors are closed...
    assert open_fds() <= before
    # ...so the transfers' ports are free again.
    for _, port in tids:
        with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as probe:
            await probe.bind(("127.0.0.1", port))


async def test_the_bound_holds_across_the_hand_over_and_slots_come_back(root):
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, max_transfers=3, retries=2)
            stalled = [await stall(addr) for _ in range(3)]
            with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
                await sock.bind(("127.0.0.1", 0))
                await sock.sendto(encode_request(Opcode.RRQ, "mid.bin", "octet"), addr)
                data, sender = await sock.recvfrom(70_000)
            busy = parse_untrusted(data)
            assert isinstance(busy, Error) and sender == addr
            # Cut to the request's 16 bytes: the source may be forged (admission.py).
            assert (busy.code, busy.message) == (0, "server busy")
            assert server.stats.transfers["busy"] == 1
            # The silent clients time out one after another and free their slots.
            await server.wait_idle()
            assert server.stats.transfers["unverified"] == 3
            got = await fetch(addr, "mid.bin", {"blksize": "1468"})
            assert got.complete and got.data == (root / "mid.bin").read_bytes()
            for sock, _ in stalled:
                sock.close()
            nursery.cancel_scope.cancel()


async def test_a_window_larger_than_the_clients_buffer_arrives_intact(root):
    # 64 blocks of 65464 bytes (4 MiB) per window: the client's receive buffer holds
    # a few, the rest is dropped, and RFC 7440 gap ACKs slide the window.
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, timeout=0.5, max_timeout=1.0, retries=20)
            options = {"blksize": "65464", "windowsize": "64", "tsize": "0"}
            got = await fetch(addr, "large.bin", options, timeout=0.3)
            assert got.complete and got.data == (root / "large.bin").read_bytes()
            await server.wait_idle()
            assert server.stats.transfers["complete"] == 1
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("busy_poll", [0.0, 0.002])
async def test_a_lone_lock_step_transfer_over_a_lossy_link(root, busy_poll):
    # Lock-step takes the fast path (ack_next) for every expected ACK; with busy_poll
    # the pump spins on the lone socket instead of epoll. Drops, duplicates and
    # reordering push it off the fast path and back, and the file arrives intact.
    want = (root / "big.bin").read_bytes()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, retries=10, busy_poll=busy_poll)
            faults = Faults(drop=0.05, dup=0.05, reorder=0.05, seed=11)
            front = await nursery.start(LossyProxy(addr, faults).run)
            got = await fetch(front, "big.bin", {"blksize": "1468"}, timeout=0.06, dally=0.5)
            assert got.complete and got.data == want
            await server.wait_idle()
            assert server.stats.transfers["complete"] == 1 and server.stats.retransmits > 0
            assert sum(faults.counts.values()) > 0
            nursery.cancel_scope.cancel()


async def test_spinning_on_the_acknowledged_transfer_never_starves_another(root):
    # Three stalled (never acknowledged) transfers leave the big download the only
    # acknowledged one, so the pump busy-polls its socket alone; the small download
    # started next has its ACKs on a socket the spin does not read. They must be
    # seen between the big one's blocks, not only once it ends.
    finished = []

    async def download(addr, name, blksize, source):
        with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
            await sock.bind((source, 0))
            got = await fetch(addr, name, {"blksize": blksize}, sock=sock)
        assert got.complete and got.data == (root / name).read_bytes()
        finished.append(name)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, timeout=30.0, max_timeout=30.0,
                                       busy_poll=0.05)  # fmt: skip
            stalled = [await stall(addr, source=f"127.0.7.{i + 1}") for i in range(3)]
            async with trio.open_nursery() as downloads:
                downloads.start_soon(download, addr, "large.bin", "512", "127.0.8.1")
                while server.stats.active < 4:  # the big one's RRQ was admitted
                    await trio.sleep(0.001)
                downloads.start_soon(download, addr, "mid.bin", "1468", "127.0.8.2")
            assert finished == ["mid.bin", "large.bin"]
            for sock, _ in stalled:
                sock.close()
            nursery.cancel_scope.cancel()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm (tmpfs) here")
@pytest.mark.parametrize("windowsize", ["1", "4"])
async def test_files_the_page_cache_cannot_vouch_for_are_read_by_a_worker(tmp_path, windowsize):
    # tmpfs refuses RWF_NOWAIT, so every chunk takes the trio-side prefetch path.
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        root = Path(shm)
        (root / "large.bin").write_bytes(os.urandom(3 << 20))
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                server, addr = await start(nursery, root)
                got = await fetch(addr, "large.bin", {"blksize": "1468", "windowsize": windowsize})
                assert got.complete and got.data == (root / "large.bin").read_bytes()
                nursery.cancel_scope.cancel()


async def test_a_file_that_shrinks_mid_transfer_ends_with_an_error(root):
    path = root / "large.bin"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root)
            with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
                await sock.bind(("127.0.0.1", 0))
                rrq = encode_request(Opcode.RRQ, "large.bin", "octet", {"blksize": "8192"})
                await sock.sendto(rrq, addr)
                packet, truncated = None, False
                while not isinstance(packet, Error):
                    data, tid = await sock.recvfrom(70_000)
                    packet = parse_untrusted(data)
                    if not isinstance(packet, Data):
                        await sock.sendto(encode_ack(0), tid)  # the OACK
                        continue
                    if not truncated:
                        truncated = True
                        os.truncate(path, 1 << 20)  # past the first read-ahead chunk
                    await sock.sendto(encode_ack(packet.block), tid)
            assert (packet.code, packet.message) == (0, "file changed during transfer")
            await server.wait_idle()
            assert server.stats.transfers["failed"] == 1
            assert server.stats.errors_sent[0] == 1
            nursery.cancel_scope.cancel()


async def test_many_lossy_transfers_at_once_never_corrupt_a_file(root):
    want = (root / "mid.bin").read_bytes()
    outcomes = []

    async def one(nursery, addr, seed):
        faults = Faults(drop=0.05, dup=0.05, reorder=0.05, seed=seed)
        front = await nursery.start(LossyProxy(addr, faults).run)
        options = {"blksize": "1024", "windowsize": str(1 + seed % 4), "tsize": "0"}
        got = await fetch(front, "mid.bin", options, timeout=0.06, dally=0.5)
        outcomes.append((got.complete, got.data == want, sum(faults.counts.values()) > 0))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            # The 12 proxies all speak from 127.0.0.1: 4 transfers at a time, the rest
            # wait their turn while their clients resend the RRQ (to the server's port).
            server, addr = await start(nursery, root, retries=10)
            async with trio.open_nursery() as clients:
                for seed in range(12):
                    clients.start_soon(one, nursery, addr, seed)
            assert outcomes == [(True, True, True)] * 12
            assert server.stats.retransmits > 0
            nursery.cancel_scope.cancel()
