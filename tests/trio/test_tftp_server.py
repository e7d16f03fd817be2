"""The TFTP shell on real loopback sockets: transfers, refusals, TIDs, the bound, loss.

The real clock drives these (the shell reads kernel sockets itself); every test is
bounded by ``trio.fail_after`` and the server's timeouts are shortened.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import trio

from plugins.tftp.confine import Refused
from plugins.tftp.packets import (
    ErrorCode,
    Opcode,
    encode_ack,
    encode_error,
    encode_request,
    parse_untrusted,
)
from plugins.tftp.server import ServerConfig, TftpServer
from plugins.tftp.stats import Stats
from tests.support.tftp import Faults, LossyProxy, fetch
from tests.unit.tftp.fakeclient import pattern

FAST = {"timeout": 0.05, "max_timeout": 0.2, "retries": 4}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    (root / "small.txt").write_bytes(b"line one\nline two\r\n")
    (root / "big.bin").write_bytes(pattern(0, 300_000))
    (root / "mid.bin").write_bytes(pattern(3, 64 * 1024))
    (root / "sub").mkdir()
    (root / "sub" / "exact.bin").write_bytes(pattern(0, 1468 * 3))
    return root


async def start(nursery, root: Path, hook=None, **overrides) -> tuple[TftpServer, tuple]:
    config = ServerConfig(root=root, port=0, **{**FAST, **overrides})
    server = TftpServer(config, Stats(), hook)
    bound = await nursery.start(server.serve)
    return server, bound[0]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"blksize": "512", "tsize": "0"},
        {"blksize": "1468", "tsize": "0"},
        {"blksize": "8192", "tsize": "0"},
        {"blksize": "1468", "windowsize": "8", "tsize": "0"},
    ],
)
async def test_files_arrive_byte_identical(root, options):
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root)
            for name in ("big.bin", "sub/exact.bin", "/small.txt"):
                got = await fetch(addr, name, options)
                want = (root / name.lstrip("/")).read_bytes()
                assert got.complete and got.error is None and got.data == want
                if options:
                    assert got.oack == {
                        k: str(len(want)) if k == "tsize" else v for k, v in options.items()
                    }
                assert got.server_tid[1] != addr[1]  # each transfer on its own port
            await server.wait_idle()  # the final ACK is on its way
            assert server.stats.transfers["complete"] == 3
            assert server.stats.bytes_sent == sum(
                len((root / n).read_bytes()) for n in ("big.bin", "sub/exact.bin", "small.txt")
            )
            assert server.stats.active == 0
            nursery.cancel_scope.cancel()


async def test_netascii_converts_line_ends_and_offers_no_tsize(root):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            _, addr = await start(nursery, root)
            got = await fetch(addr, "small.txt", {"tsize": "0", "blksize": "8"}, mode="NetASCII")
            assert got.data == b"line one\r\nline two\r\0\r\n"
            assert got.oack == {"blksize": "8"}
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("name", "code", "message"),
    [
        ("missing.bin", ErrorCode.FILE_NOT_FOUND, "missing.bin: file not found"),
        ("../etc/passwd", ErrorCode.ACCESS_VIOLATION, "../etc/passwd: access violation"),
        ("sub", ErrorCode.ACCESS_VIOLATION, "sub: access violation"),
        ("sub\\exact.bin", ErrorCode.ACCESS_VIOLATION, "sub\\exact.bin: access violation"),
    ],
)
async def test_refusals_name_only_what_was_asked(root, name, code, message):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root)
            got = await fetch(addr, name)
            assert got.error == (code, message) and got.data == b""
            assert str(root) not in got.error[1]
            assert server.stats.transfers["refused"] == 1
            assert server.stats.errors_sent[code] == 1
            nursery.cancel_scope.cancel()


async def request(addr, packet: bytes, wait: float = 2.0):
    """Send one datagram; the first answer parsed, or None if none comes."""
    with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
        await sock.bind(("127.0.0.1", 0))
        await sock.sendto(packet, addr)
        with trio.move_on_after(wait):
            data, sender = await sock.recvfrom(70_000)
            return parse_untrusted(data), sender
    return None


async def test_write_requests_and_unknown_modes_are_refused(root):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root)
            (error, sender) = await request(addr, encode_request(Opcode.WRQ, "new.bin"))
            assert (error.code, error.message) == (2, "new.bin: write requests are refused")
            assert sender == addr
            (error, _) = await request(addr, encode_request(Opcode.RRQ, "small.txt", "mail"))
            assert (error.code, error.message) == (4, "mail: unsupported mode")
            assert not (root / "new.bin").exists()
            assert server.stats.transfers["refused"] == 2
            nursery.cancel_scope.cancel()


async def test_malformed_datagrams_are_counted_and_dropped(root):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root)
            for junk in (b"", b"\x00", b"\x00\x01name-without-mode", b"\x00\x09xx", encode_ack(3)):
                assert await request(addr, junk, wait=0.1) is None
            assert server.stats.malformed == 5
            got = await fetch(addr, "small.txt")  # still serving
            assert got.complete
            nursery.cancel_scope.cancel()


async def test_strangers_never_reach_a_transfer(root):
    """The transfer socket is connected to its client: another port's ACK is refused
    by the kernel (ICMP port unreachable) and the transfer goes on."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root)
            with (
                trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock,
                trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as stranger,
            ):
                await sock.bind(("127.0.0.1", 0))
                await sock.sendto(encode_request(Opcode.RRQ, "sub/exact.bin", "octet"), addr)
                first, tid = await sock.recvfrom(70_000)
                assert parse_untrusted(first).block == 1
                await stranger.connect(tid)
                await stranger.send(encode_ack(1))
                with pytest.raises(ConnectionRefusedError):
                    await stranger.recv(100)
                await sock.sendto(encode_ack(1), tid)
                second, _ = await sock.recvfrom(70_000)
                assert parse_untrusted(second).block == 2
            nursery.cancel_scope.cancel()


async def test_requests_past_max_transfers_get_a_clean_busy_error(root):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, max_transfers=1, timeout=5.0, max_timeout=5.0)
            with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
                await sock.bind(("127.0.0.1", 0))
                rrq = encode_request(Opcode.RRQ, "big.bin", "octet")
                await sock.sendto(rrq, addr)
                await sock.recvfrom(70_000)  # DATA 1, never acknowledged: the slot stays taken
                await sock.sendto(rrq, addr)  # a retransmitted request is not a second transfer
                small = encode_request(Opcode.RRQ, "pxelinux.cfg/default", "octet")
                (error, _) = await request(addr, small)
                assert (error.code, error.message) == (0, "server busy, try again l")
                assert len(encode_error(error.code, error.message)) == len(small)  # no more
                assert server.stats.active == 1 and server.stats.transfers["busy"] == 1
                assert server.stats.refusals["busy"] == 1
            nursery.cancel_scope.cancel()


async def test_a_silent_client_times_out_and_frees_its_slot(root):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, retries=2)
            assert (await request(addr, encode_request(Opcode.RRQ, "big.bin", "octet")))[
                0
            ].block == 1
            await server.wait_idle()  # 0.05 + 0.1 + 0.2 s of retransmits, then given up
            assert server.stats.transfers["unverified"] == 1  # it never acknowledged a block
            assert server.stats.retransmits == 2
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("windowsize", ["1", "4"])
async def test_a_lossy_path_never_corrupts_a_file(root, seed, windowsize):
    faults = Faults(drop=0.05, dup=0.05, reorder=0.05, seed=seed)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, retries=10)
            proxy = LossyProxy(addr, faults)
            front = await nursery.start(proxy.run)
            options = {"blksize": "1024", "windowsize": windowsize, "tsize": "0"}
            got = await fetch(front, "mid.bin", options, timeout=0.06, dally=0.5)
            assert got.complete and got.data == (root / "mid.bin").read_bytes()
            assert sum(faults.counts.values()) > 0
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("count", [50, 100])
async def test_many_concurrent_transfers(root, count):
    names = ["big.bin", "mid.bin", "sub/exact.bin"]
    want = {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in names}
    results = []

    async def one(addr, i):
        name = names[i % 3]
        options = {"blksize": ("1468", "512", "8192")[i % 3], "windowsize": str(1 + i % 4)}
        with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
            await sock.bind((f"127.0.1.{i + 1}", 0))  # a rack: each machine its own address
            got = await fetch(addr, name, options, timeout=0.5, limit=120, sock=sock)
        results.append(hashlib.sha256(got.data).hexdigest() == want[name])

    with trio.fail_after(150):
        async with trio.open_nursery() as nursery:
            server, addr = await start(nursery, root, timeout=1.0, max_timeout=2.0, retries=10)
            async with trio.open_nursery() as clients:
                for i in range(count):
                    clients.start_soon(one, addr, i)
            assert results == [True] * count
            await server.wait_idle()
            assert server.stats.transfers["complete"] == count
            sizes = [(root / names[i % 3]).stat().st_size for i in range(count)]
            assert server.stats.bytes_sent == sum(sizes)
            nursery.cancel_scope.cancel()


async def test_the_open_hook_serves_bytes_paths_and_refusals(root, tmp_path):
    outside = tmp_path / "image.bin"
    outside.write_bytes(pattern(5, 5000))
    seen = []

    def hook(path, client):
        seen.append((path, str(client.address), str(client.local)))
        if path == "boot.ipxe":
            return f"#!ipxe\necho hello {client.address}\n".encode()
        if path == "image.bin":
            return outside
        if path == "secret":
            raise Refused(ErrorCode.ACCESS_VIOLATION, "secret: not for you")
        if path == "broken":
            raise RuntimeError("bug")
        return None

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            _, addr = await start(nursery, root, hook)
            got = await fetch(addr, "/boot.ipxe", {"tsize": "0"})
            assert got.data == b"#!ipxe\necho hello 127.0.0.1\n"
            assert got.oack == {"tsize": str(len(got.data))}
            assert (await fetch(addr, "image.bin")).data == outside.read_bytes()
            assert (await fetch(addr, "secret")).error == (2, "secret: not for you")
            assert (await fetch(addr, "broken")).error == (0, "broken: server error")
            assert (await fetch(addr, "small.txt")).data == (root / "small.txt").read_bytes()
            nursery.cancel_scope.cancel()
    assert seen[0] == ("boot.ipxe", "127.0.0.1", "127.0.0.1")
