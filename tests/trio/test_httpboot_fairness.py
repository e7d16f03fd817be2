"""Admission in the shell: the cap per source, a full table displacing a flood's waiting
connections for a newcomer, downloads never displaced. Real loopback sockets from distinct
source addresses (127.0.0.0/8 is all local), every wait bounded."""

from __future__ import annotations

import logging

import trio
import trio.testing

from plugins.httpboot.admission import BUSY, HEAD, IDLE
from plugins.httpboot.connection import Connection, Limits
from plugins.httpboot.stats import Stats
from tests.support.http import Client
from tests.trio import test_httpboot_server as shell

LIMIT, routes, serving = shell.LIMIT, shell.routes, shell.serving
root = shell.root  # the fixture: a root with small.txt and big.bin

FLOOD, LEGIT, OTHER = "127.0.0.2", "127.0.0.3", "127.0.0.4"
PARTIAL_HEAD = b"GET /files/small.txt HTTP/1.1\r\nhost: x\r\nx-slow: "


async def connect_from(address: tuple[str, int], source: str) -> Client:
    return Client(await trio.open_tcp_stream(*address, local_address=source))


async def until(predicate) -> None:
    while not predicate():
        await trio.sleep(0.01)


async def test_a_source_past_its_cap_gets_503_and_others_are_served(root):
    with trio.fail_after(LIMIT):
        async with serving(root, max_connections=100, max_per_source=3) as (address, server):
            flood = [await connect_from(address, FLOOD) for _ in range(3)]
            for client in flood:
                await client.send_raw(PARTIAL_HEAD)
            await until(lambda: server.stats.active_connections == 3)
            refused = await connect_from(address, FLOOD)
            await refused.send_raw(b"GET /files/small.txt HTTP/1.1\r\nhost: x\r\n\r\n")
            reply = await refused.reply()
            assert reply.status == 503 and reply.header(b"retry-after") == b"1"
            legit = await connect_from(address, LEGIT)
            assert (await legit.request("GET", "/files/small.txt")).status == 200
            assert server.stats.rejected == {"per-source": 1, "full": 0}
            for client in [*flood, refused, legit]:
                await client.aclose()


async def test_a_full_table_displaces_the_floods_oldest_waiting_connection(root, caplog):
    caplog.set_level(logging.INFO, logger="rackboot.httpboot")
    with trio.fail_after(LIMIT):
        async with serving(root, max_connections=4, max_per_source=4) as (address, server):
            flood = []
            for _ in range(4):  # one at a time: their order is their age
                flood.append(await connect_from(address, FLOOD))
                await flood[-1].send_raw(PARTIAL_HEAD)
                await until(lambda: server.stats.connections == len(flood))
            legit = await connect_from(address, LEGIT)
            assert (await legit.request("GET", "/files/small.txt")).body == b"0123456789"
            assert await flood[0].closed_by_server()  # the oldest wait, closed without answer
            assert server.stats.displaced == {"head": 1, "idle": 0}
            (line,) = [r.fields for r in caplog.records if r.getMessage() == "displaced"]
            assert line["client"] == FLOOD and LEGIT in line["reason"]
            # the legit client now idles on a kept-alive connection; another newcomer takes
            # the flood's next oldest (its source holds 3), not the legit client's
            other = await connect_from(address, OTHER)
            assert (await other.request("GET", "/files/small.txt")).status == 200
            assert await flood[1].closed_by_server()
            assert (await legit.request("GET", "/files/small.txt")).status == 200
            assert server.stats.rejected_connections == 0
            for client in [*flood, legit, other]:
                await client.aclose()


async def test_downloads_in_progress_are_never_displaced(root):
    content = (root / "big.bin").read_bytes()
    with trio.fail_after(LIMIT):
        async with serving(root, max_connections=2, max_per_source=2) as (address, server):
            downloads = [await connect_from(address, FLOOD) for _ in range(2)]
            for client in downloads:  # requests in, the replies not read: both busy sending
                await client.send_raw(b"GET /files/big.bin HTTP/1.1\r\nhost: x\r\n\r\n")
            await until(lambda: server.admission.in_phase(BUSY) == 2)  # both heads parsed
            newcomer = await connect_from(address, LEGIT)
            await newcomer.send_raw(b"GET /files/small.txt HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await newcomer.reply()).status == 503
            assert server.stats.rejected == {"per-source": 0, "full": 1}
            for client in downloads:  # both complete, byte for byte
                assert (await client.reply()).body == content
                await client.aclose()
            await newcomer.aclose()


async def test_the_connection_reports_what_it_waits_for(root, autojump_clock):
    client_stream, server_stream = trio.testing.memory_stream_pair()
    phases: list[str] = []
    connection = Connection(
        server_stream, routes(root), Limits(), Stats(), ("10.0.0.5", 1), ("10.0.0.1", 80),
        on_phase=phases.append,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.serve)
        client = Client(client_stream)
        assert (await client.request("GET", "/files/small.txt")).status == 200
        assert phases == [BUSY, IDLE]  # admitted waiting for its head: the server marks that
        await client.send_raw(b"GET /files/small.txt HTTP/1.1\r\n")  # a head begins
        await trio.sleep(1)
        assert phases == [BUSY, IDLE, HEAD]
        await client.send_raw(b"host: x\r\n\r\n")  # raw bytes: read the answer raw too
        assert (await client_stream.receive_some(1 << 16)).startswith(b"HTTP/1.1 200 OK\r\n")
        assert phases == [BUSY, IDLE, HEAD, BUSY, IDLE]
        await client.aclose()
