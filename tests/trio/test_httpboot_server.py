"""The HTTP shell: real loopback sockets (sendfile) on the real clock, every wait bounded;
in-memory streams (the copying path) on the autojump clock for the timeouts."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from ipaddress import IPv4Address
from pathlib import Path

import pytest
import trio
import trio.testing

from appliance import confine
from plugins.httpboot.conditional import Validators
from plugins.httpboot.connection import Connection, Limits
from plugins.httpboot.messages import Request, Response, Route
from plugins.httpboot.router import Router
from plugins.httpboot.server import MAX_CONNECTIONS_PER_SOURCE, HttpServer
from plugins.httpboot.stats import Stats
from tests.support.http import Client, fetch, raw_exchange

BIG = 8 << 20
LIMIT = 20  # seconds any one test may take


def static(root: Path):
    def handler(request: Request) -> Response:
        try:
            return Response.file(*confine.open_confined(root, request.params["path"]))
        except confine.NotFound:
            return Response.error(404)
        except confine.Refused:
            return Response.error(403)

    return handler


def echo(request: Request) -> Response:
    return Response.json({"got": request.body.decode(), "params": request.params})


def broken(request: Request) -> Response:
    raise RuntimeError("/secret/path/in/the/exception")


def routes(root: Path) -> Router:
    return Router(
        [
            Route("POST", "/echo/{name}", echo, max_body=1000),
            Route("GET", "/broken", broken),
            Route("GET", "/files/{path:path}", static(root)),
        ]
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(BIG))
    (root / "small.txt").write_bytes(b"0123456789")
    return root


@contextlib.asynccontextmanager
async def serving(
    root: Path,
    limits: Limits | None = None,
    max_connections: int = 100,
    max_per_source: int = MAX_CONNECTIONS_PER_SOURCE,
) -> AsyncIterator[tuple[tuple[str, int], HttpServer]]:
    stats = Stats()
    server = HttpServer(
        (IPv4Address("127.0.0.1"),), 0, routes(root), limits or Limits(), stats, max_connections,
        max_per_source=max_per_source,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server.bound[0], server
        nursery.cancel_scope.cancel()


async def test_keep_alive_get_head_and_pipelining(root):
    with trio.fail_after(LIMIT):
        async with serving(root) as (address, server):
            client = await Client.connect(address)
            first = await client.request("GET", "/files/small.txt")
            head = await client.request("HEAD", "/files/small.txt")
            again = await client.request("GET", "/files/small.txt")
            assert (first.status, first.body) == (200, b"0123456789")
            assert head.status == 200 and head.body == b""
            assert head.header(b"content-length") == b"10"
            assert head.header(b"etag") == first.header(b"etag") == again.header(b"etag")
            assert first.header(b"content-type") == b"text/plain; charset=utf-8"
            await client.aclose()
            two = b"GET /files/small.txt HTTP/1.1\r\nhost: x\r\n\r\n" * 2
            raw = await raw_exchange(
                address, two + b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            )
            assert raw.count(b"HTTP/1.1 200 OK") == 2 and raw.count(b"0123456789") == 2
            assert raw.count(b"HTTP/1.1 404 Not Found") == 1
            assert server.stats.connections == 2 and server.stats.active_connections <= 1


async def test_big_file_by_sendfile_ranges_and_validators(root):
    content = (root / "big.bin").read_bytes()
    with trio.fail_after(LIMIT):
        async with serving(root) as (address, _):
            client = await Client.connect(address)
            whole = await client.request("GET", "/files/big.bin")
            assert whole.status == 200 and whole.body == content
            etag = whole.header(b"etag")
            part = await client.request(
                "GET", "/files/big.bin", [("range", "bytes=1000000-2999999")]
            )
            assert part.status == 206 and part.body == content[1_000_000:3_000_000]
            assert part.header(b"content-range") == b"bytes 1000000-2999999/%d" % BIG
            tail = await client.request("GET", "/files/big.bin", [("range", "bytes=-100")])
            assert tail.body == content[-100:]
            past = await client.request("GET", "/files/big.bin", [("range", f"bytes={BIG}-")])
            assert past.status == 416 and past.header(b"content-range") == b"bytes */%d" % BIG
            stale = await client.request(
                "GET", "/files/big.bin", [("range", "bytes=0-9"), ("if-range", '"old"')]
            )
            assert stale.status == 200 and len(stale.body) == BIG
            same = await client.request("GET", "/files/big.bin", [("if-none-match", etag.decode())])
            assert same.status == 304 and same.body == b"" and same.header(b"etag") == etag
            since = whole.header(b"last-modified").decode()
            assert (
                await client.request("HEAD", "/files/big.bin", [("if-modified-since", since)])
            ).status == 304
            (root / "big.bin").write_bytes(content[:-1])  # changed: the old tag no longer matches
            changed = await client.request(
                "GET", "/files/big.bin", [("if-none-match", etag.decode())]
            )
            assert changed.status == 200 and changed.body == content[:-1]
            await client.aclose()


async def test_errors_reveal_nothing_and_are_answered(root):
    with trio.fail_after(LIMIT):
        async with serving(root) as (address, server):
            failed = await fetch(address, "GET", "/broken")
            assert failed.status == 500 and failed.body == b"500 Internal Server Error\n"
            missing = await fetch(address, "GET", "/files/nothing")
            assert missing.status == 404 and b"nothing" not in missing.body
            assert str(root).encode() not in missing.body
            wrong = await fetch(address, "PUT", "/files/small.txt", body=b"x")
            assert wrong.status == 405 and wrong.header(b"allow") == b"GET, HEAD"
            encoded = await fetch(address, "GET", "/files/%2e%2e/secret")
            assert encoded.status == 403
            big_head = b"GET / HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 20000 + b"\r\n"
            assert (await raw_exchange(address, big_head)).startswith(b"HTTP/1.1 431 ")  # partial
            whole = big_head + b"\r\n"  # complete in one read: still too big
            assert (await raw_exchange(address, whole)).startswith(b"HTTP/1.1 431 ")
            assert (await raw_exchange(address, b"NOT HTTP AT ALL\r\n\r\n")).startswith(
                b"HTTP/1.1 400 "
            )
            nul = b"GET /files/a%00b HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            assert (await raw_exchange(address, nul)).startswith(b"HTTP/1.1 400 ")
            assert server.stats.malformed >= 4


async def test_request_bodies_are_capped(root):
    with trio.fail_after(LIMIT):
        async with serving(root) as (address, _):
            ok = await fetch(address, "POST", "/echo/x", body=b"hello")
            assert ok.status == 200 and ok.body == b'{"got":"hello","params":{"name":"x"}}\n'
            too_big = await fetch(address, "POST", "/echo/x", body=b"x" * 1001)
            assert too_big.status == 413 and too_big.header(b"connection") == b"close"
            chunked = (
                b"POST /echo/x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                + b"3e8\r\n" + b"y" * 1000 + b"\r\n" + b"10\r\n" + b"z" * 16 + b"\r\n0\r\n\r\n"
            )  # fmt: skip
            assert (await raw_exchange(address, chunked)).startswith(b"HTTP/1.1 413 ")
            continued = await fetch(
                address, "POST", "/echo/x", headers=[("expect", "100-continue")], body=b"go"
            )
            assert continued.status == 200 and b'"got":"go"' in continued.body
            no_body_route = await fetch(address, "GET", "/files/small.txt", body=b"unexpected")
            assert no_body_route.status == 413


async def test_connections_past_the_bound_get_503(root):
    with trio.fail_after(LIMIT):
        async with serving(root, max_connections=2) as (address, server):
            held = [await Client.connect(address) for _ in range(2)]
            assert (await held[0].request("GET", "/files/small.txt")).status == 200
            assert (await held[1].request("GET", "/files/small.txt")).status == 200
            refused = await raw_exchange(
                address, b"GET /files/small.txt HTTP/1.1\r\nhost: x\r\n\r\n"
            )
            assert refused.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
            assert b"retry-after: 1" in refused
            assert server.stats.rejected_connections == 1
            await held[0].aclose()
            while server.stats.active_connections > 1:
                await trio.sleep(0.01)
            assert (await fetch(address, "GET", "/files/small.txt")).status == 200
            await held[1].aclose()


async def test_a_client_that_stops_reading_is_cut_after_send_timeout(root):
    (root / "huge.bin").write_bytes(b"\0" * (64 << 20))  # more than both socket buffers hold
    limits = Limits(send_timeout=0.3)
    with trio.fail_after(LIMIT):
        async with serving(root, limits) as (address, server):
            client = await Client.connect(address)
            await client.send_raw(b"GET /files/huge.bin HTTP/1.1\r\nhost: x\r\n\r\n")
            # Counted when the send times out; the slot is released after the socket is
            # closed (a shielded close, slower under load): wait for both, bounded above.
            while server.stats.timeouts["send"] == 0 or server.stats.active_connections:
                await trio.sleep(0.05)
            await client.aclose()


# -- the connection alone, on in-memory streams and the autojump clock ----------------


async def run_connection(stream, root: Path, limits: Limits, stats: Stats) -> None:
    connection = Connection(
        stream, routes(root), limits, stats, ("10.0.0.5", 1234), ("10.0.0.1", 80)
    )
    await connection.serve()


async def test_copying_path_serves_the_same_bytes(root, autojump_clock):
    client_stream, server_stream = trio.testing.memory_stream_pair()
    stats = Stats()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_connection, server_stream, root, Limits(), stats)
        client = Client(client_stream)
        reply = await client.request("GET", "/files/big.bin", [("range", "bytes=5-")])
        assert reply.status == 206 and reply.body == (root / "big.bin").read_bytes()[5:]
        assert stats.bytes_sent == BIG - 5
        await client.aclose()


async def test_slow_request_head_is_cut_after_request_timeout(root, autojump_clock):
    client_stream, server_stream = trio.testing.memory_stream_pair()
    stats = Stats()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_connection, server_stream, root, Limits(request_timeout=10.0), stats)
        client = Client(client_stream)
        started = trio.current_time()
        with pytest.raises(trio.BrokenResourceError):  # the server hangs up on us
            for byte in b"GET /files/small.txt HTTP/1.1\r\n":  # a byte a second: slowloris
                await client.send_raw(bytes([byte]))
                await trio.sleep(1)
        assert 10.0 <= trio.current_time() - started < 12.0
        assert stats.timeouts["request"] == 1


async def test_idle_keep_alive_ends_after_idle_timeout(root, autojump_clock):
    client_stream, server_stream = trio.testing.memory_stream_pair()
    stats = Stats()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_connection, server_stream, root, Limits(idle_timeout=60.0), stats)
        client = Client(client_stream)
        assert (await client.request("GET", "/files/small.txt")).status == 200
        await trio.sleep(59)
        assert (await client.request("GET", "/files/small.txt")).status == 200  # still open
        served = trio.current_time()
        assert await client.closed_by_server()
        assert trio.current_time() - served == pytest.approx(60.0, abs=0.01)
        assert stats.timeouts["idle"] == 1


async def test_stalled_reader_is_cut_after_send_timeout(root, autojump_clock):
    client_stream, server_stream = trio.testing.lockstep_stream_pair()  # sends wait for reads
    stats = Stats()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_connection, server_stream, root, Limits(send_timeout=30.0), stats)
        await client_stream.send_all(b"GET /files/big.bin HTTP/1.1\r\nhost: x\r\n\r\n")
        assert await client_stream.receive_some(100)  # the first bytes, then nothing read
        started = trio.current_time()
        while stats.timeouts["send"] == 0:
            await trio.sleep(1)
        assert trio.current_time() - started == pytest.approx(30.0, abs=1.0)


def test_validators_change_with_the_file(root):
    st = (root / "small.txt").stat()
    before = Validators.of_file(st.st_size, st.st_mtime_ns, st.st_ino).etag
    (root / "small.txt").write_bytes(b"01234567890")
    st = (root / "small.txt").stat()
    assert Validators.of_file(st.st_size, st.st_mtime_ns, st.st_ino).etag != before
