"""The per-request fast path: reads and writes without a trio wait must still leave the
other connections their turn, and the openat2 file path must serve a file replaced on
disk fresh and leave a link out of the root refused. Real loopback sockets, bounded."""

from __future__ import annotations

import os
from ipaddress import IPv4Address

import trio

from plugins.httpboot.connection import MAX_UNYIELDED, Limits
from plugins.httpboot.messages import Request, Response, Route
from plugins.httpboot.router import Router
from plugins.httpboot.server import HttpServer
from plugins.httpboot.stats import Stats
from tests.support.http import Client
from tests.trio.test_httpboot_files import get
from tests.trio.test_httpboot_plugin import builtin_routes

LIMIT = 20
PIPELINED = 20 * MAX_UNYIELDED


async def test_a_pipelining_client_does_not_hold_the_others_back():
    """One client sends ``PIPELINED`` requests in one write, another a single request
    just after: the second is answered after at most a few turns of the first, not after
    all of them (each answer is written without a wait, so only the connection's own
    checkpoint every ``MAX_UNYIELDED`` requests lets the other in)."""
    order: list[str] = []

    def record(request: Request) -> Response:
        order.append(request.params["who"])
        return Response.text("ok")

    server = HttpServer((IPv4Address("127.0.0.1"),), 0,
                        Router([Route("GET", "/order/{who}", record)]), Limits(), Stats(), 100)  # fmt: skip
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            pipeliner = await Client.connect(server.bound[0])
            other = await Client.connect(server.bound[0])
            await pipeliner.send_raw(b"GET /order/a HTTP/1.1\r\nhost: x\r\n\r\n" * PIPELINED)
            reply = await other.request("GET", "/order/b")
            assert reply.status == 200
            while len(order) < PIPELINED + 1:  # the pipeliner's answers all come too
                await trio.sleep(0.01)
            assert order.index("b") <= 3 * MAX_UNYIELDED, order.index("b")
            for client in (pipeliner, other):
                await client.aclose()
            nursery.cancel_scope.cancel()


async def test_a_file_replaced_on_disk_is_served_fresh_with_new_validators(tmp_path):
    routes = builtin_routes(tmp_path)
    (tmp_path / "ipxe.efi").write_bytes(b"first")
    first = routes.static(get("ipxe.efi"))
    assert first.status == 200 and first.region is not None
    first.close()
    staged = tmp_path / "ipxe.efi.new"
    staged.write_bytes(b"second, longer")
    os.replace(staged, tmp_path / "ipxe.efi")
    second = routes.static(get("ipxe.efi"))
    assert second.region is not None and second.stat is not None
    with second.region.handle as handle:
        assert handle.read() == b"second, longer"
    assert first.stat is not None and (first.stat.st_ino, first.stat.st_size) != (
        second.stat.st_ino,
        second.stat.st_size,
    )


async def test_links_out_of_the_root_stay_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (root / "absolute").symlink_to(outside / "secret")
    (root / "relative").symlink_to("../outside/secret")
    (root / "dir").symlink_to(outside)
    routes = builtin_routes(root)
    for name in ("absolute", "relative", "dir/secret"):
        refused = routes.static(get(name))
        assert refused.status == 403 and refused.region is None, name
