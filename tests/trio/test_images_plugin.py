"""The images plugin in a node (real loopback sockets and control socket, every test
bounded): `image add` through the control socket, the head committed to the state log,
the current version served by name over HTTP and TFTP, a restart, a damaged file."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from appliance import control
from appliance.errors import ConfigError, RackbootError
from appliance.node import Node
from plugins.httpboot.plugin import HttpBootPlugin
from plugins.images.follow import HEADS_NS
from plugins.images.manifest import open_untrusted
from plugins.images.plugin import ImagesPlugin
from plugins.tftp import plugin as tftp_plugin
from tests.support.http import fetch
from tests.support.plugins import configured
from tests.support.tftp import fetch as tftp_fetch

LIMIT = 30
DOCUMENT = {
    "httpboot": {"port": 0},
    "tftp": {"port": 0},
    "images": {"min_chunk": 1024, "avg_chunk": 4096, "max_chunk": 16384},
}


@contextlib.asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[tuple[Node, ImagesPlugin]]:
    images = ImagesPlugin()
    config, pm = configured(tmp_path, DOCUMENT, images=images, httpboot=HttpBootPlugin(),
                            tftp=tftp_plugin)  # fmt: skip
    node = Node(config, pm)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        yield node, images
        node.request_stop("test")


async def call(node: Node, cmd: str, **args):
    return await trio.to_thread.run_sync(control.call, node.control_path, cmd, args)


def listening(node: Node, plugin: str) -> tuple[str, int]:
    host, port = node.status()[plugin]["listening"][0].split(":")
    return host, int(port)


async def test_an_added_image_is_committed_and_served_by_name_over_http_and_tftp(tmp_path):
    data = random.Random(1).randbytes(150_000)
    (tmp_path / "a.img").write_bytes(data)
    with trio.fail_after(LIMIT):
        async with running(tmp_path) as (node, images):
            added = await call(node, "images.add", name="debian", file=str(tmp_path / "a.img"))
            assert added["image"] == "debian@1" and added["committed"] is True
            envelope = node.state.get(HEADS_NS, "debian@1")
            state = images.stores[node]
            assert open_untrusted(envelope, state.trust).sha256.hex() == added["sha256"]
            reply = await fetch(listening(node, "httpboot"), "GET", "/images/debian")
            assert reply.status == 200 and reply.body == data
            assert (await fetch(listening(node, "httpboot"), "GET", "/images/other")).status == 404
            got = await tftp_fetch(listening(node, "tftp"), "images/debian", {"blksize": "1468"})
            assert got.complete and got.data == data
            (tmp_path / "a.img").write_bytes(data[:1000] + b"new" + data[1000:])
            await call(node, "images.add", name="debian", file=str(tmp_path / "a.img"))
            reply = await fetch(listening(node, "httpboot"), "GET", "/images/debian")
            assert reply.body == data[:1000] + b"new" + data[1000:]  # the new version is served
        async with running(tmp_path) as (node, images):  # again after a restart
            listed = await call(node, "images.list")
            assert [v["version"] for v in listed[0]["versions"]] == ["1", "2"]
            assert listed[0]["current"] == "2"
            assert node.status()["images"]["missing"] == []


async def test_a_damaged_image_fails_verify_with_a_reason(tmp_path):
    (tmp_path / "a.img").write_bytes(os.urandom(60_000))
    with trio.fail_after(LIMIT):
        async with running(tmp_path) as (node, _):
            await call(node, "images.add", name="k", file=str(tmp_path / "a.img"), version="v1")
            assert (await call(node, "images.verify", name="k")) == {"image": "k@v1", "ok": True}
            path = Path((await call(node, "images.show", name="k"))["path"])
            os.chmod(path, 0o644)
            with open(path, "r+b") as f:
                f.write(b"\0\0\0\0")
            with pytest.raises(RackbootError, match="k@v1 is damaged: chunk 0"):
                await call(node, "images.verify", name="k")


def test_chunk_sizes_pyfastcdc_refuses_are_a_config_error_naming_the_keys(tmp_path):
    with pytest.raises(ConfigError, match="images.avg_chunk: expected min_chunk <= avg_chunk"):
        configured(tmp_path, {"images": {"min_chunk": 70_000}}, images=ImagesPlugin())


async def test_partial_files_of_versions_not_committed_go_at_start_and_with_gc(tmp_path):
    (tmp_path / "a.img").write_bytes(random.Random(2).randbytes(50_000))

    def leave_partials(node: Node, images: ImagesPlugin, *versions: str) -> list[Path]:
        store = images.stores[node].store
        paths = [store.partial_path("debian", v) for v in versions]
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"half")
            path.with_name(path.name + ".done").write_bytes(b"\x00")
        return paths

    with trio.fail_after(LIMIT):
        async with running(tmp_path) as (node, images):
            await call(node, "images.add", name="debian", file=str(tmp_path / "a.img"))
            stale, held = leave_partials(node, images, "9", "1")  # 9: never committed
            removed = await call(node, "images.gc")
            # gc removes them, unless the follower's pass after the add came first
            assert set(removed["removed"]) <= {
                "partial partial/debian/1", "partial partial/debian/1.done",
                "partial partial/debian/9", "partial partial/debian/9.done"}  # fmt: skip
            assert not stale.exists() and not held.exists()
            stale, _ = leave_partials(node, images, "9", "1")  # as a crash would leave them
        async with running(tmp_path) as (node, images):  # the follower prunes at start
            with trio.fail_after(5):
                while stale.exists():
                    await trio.sleep(0.01)
            assert images.stores[node].store.images["debian"].keys() == {"1"}
