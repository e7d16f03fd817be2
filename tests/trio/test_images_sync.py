"""Syncing image versions from peers (plugins/images/sync.py) over real loopback HTTP:
the peers are nodes serving their stores; the receiver is a store and a Syncer. Every
test bounded; sizes small (the chunker's parameters scaled down)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from appliance.cluster import pki
from appliance.node import Node
from plugins.httpboot.plugin import HttpBootPlugin
from plugins.images.manifest import BadManifest, public_raw, seal
from plugins.images.peer import Peer
from plugins.images.plugin import ImagesPlugin
from plugins.images.store import ImageStore
from plugins.images.sync import Syncer, SyncError
from tests.support.plugins import configured
from tests.trio.test_cluster import wait_until

LIMIT = 30
CHUNKS = {"min_chunk": 1024, "avg_chunk": 4096, "max_chunk": 16384}


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, name: str, key: Ed25519PrivateKey, *peers: Peer
                  ) -> AsyncIterator[tuple]:  # fmt: skip
    """A node whose store signs with ``key`` and syncs from ``peers``; yields (node, its
    images state, a Peer for its HTTP server)."""
    root = tmp_path / name / "images"
    root.mkdir(parents=True)
    (root / "local-signing.key").write_bytes(pki.key_to_pem(key))
    images = ImagesPlugin()
    images_settings = {**CHUNKS, "root": str(root), "peers": [str(p) for p in peers]}
    document = {"httpboot": {"port": 0}, "images": images_settings,
                "node": {"data_dir": str(tmp_path / name / "data")}}  # fmt: skip
    config, pm = configured(tmp_path, document, images=images, httpboot=HttpBootPlugin())
    node = Node(config, pm)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        host, port = node.status()["httpboot"]["listening"][0].split(":")
        yield node, images.stores[node], Peer(host, int(port))
        node.request_stop("test")


def receiver(tmp_path: Path, key: Ed25519PrivateKey, **kw) -> Syncer:
    def trust(cert_der, public, head):
        if cert_der or public != public_raw(key.public_key()):
            raise BadManifest("not the test's key")
        return key.public_key()

    store = ImageStore(tmp_path / "receiver", trust)
    store.load()
    return Syncer(store, **kw)


async def add(state, tmp_path: Path, data: bytes, version: str) -> bytes:
    path = tmp_path / f"src-{version}"
    path.write_bytes(data)
    result = await state.add({"name": "img", "file": str(path), "version": version})
    return state.store.images["img"][result["version"]].envelope


def disk_like(size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < size:  # random runs and zero runs, as a filesystem image has
        out += rng.randbytes(rng.randint(20_000, 80_000)) + bytes(rng.randint(0, 60_000))
    return bytes(out[:size])


async def test_a_first_sync_then_an_edit_moves_only_the_changed_chunks(tmp_path):
    key = Ed25519PrivateKey.generate()
    base = disk_like(600_000, 1)
    with trio.fail_after(LIMIT):
        async with serving(tmp_path, "a", key) as (_, a, peer):
            envelope = await add(a, tmp_path, base, "1")
            syncer = receiver(tmp_path, key)
            got = await syncer.fetch(envelope, [peer])
            assert got.path.read_bytes() == base and oct(got.path.stat().st_mode)[-3:] == "444"
            first = dataclasses.replace(syncer.stats)
            assert first.chunks_zero > 0 and first.bytes_fetched < len(base)  # zeros stay local
            edited = base[:100_000] + b"x" * 1000 + base[100_000:]
            envelope = await add(a, tmp_path, edited, "2")
            got = await syncer.fetch(envelope, [peer])
            assert got.path.read_bytes() == edited
            fetched = syncer.stats.bytes_fetched - first.bytes_fetched
            assert fetched <= 3 * 16384  # the chunks around the insertion, nothing else
            assert syncer.stats.chunks_seeded > 0
            table_delta = syncer.stats.table_bytes - first.table_bytes
            assert table_delta < len(got.table.encode()) / 4  # the table came as a delta


async def test_a_bad_chunk_from_one_peer_is_refused_and_fetched_from_another(tmp_path):
    key = Ed25519PrivateKey.generate()
    data = os.urandom(300_000)
    with trio.fail_after(LIMIT):
        async with (
            serving(tmp_path, "a", key) as (_, a, peer_a),
            serving(tmp_path, "c", key) as (_, c, peer_c),
        ):
            envelope = await add(a, tmp_path, data, "1")
            await c.syncer.fetch(envelope, [peer_a])  # c holds it too now
            path = a.store.images["img"]["1"].path
            os.chmod(path, 0o644)
            with open(path, "r+b") as f:  # every chunk of a's copy is damaged
                f.write(bytes(len(data)))
            # runs of 32 kB: each peer's worker takes one before either waits on the network
            syncer = receiver(tmp_path, key, run_bytes=32_768)
            got = await syncer.fetch(envelope, [peer_a, peer_c])
            assert got.path.read_bytes() == data
            assert syncer.stats.refused["chunk"] == 1


async def test_a_forged_head_is_refused_and_no_peer_means_an_error(tmp_path):
    key, forger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    with trio.fail_after(LIMIT):
        async with serving(tmp_path, "a", key) as (_, a, peer):
            envelope = await add(a, tmp_path, os.urandom(50_000), "1")
            head = a.store.images["img"]["1"].head
            forged = seal(dataclasses.replace(head, version="9"), forger)
            syncer = receiver(tmp_path, key)
            with pytest.raises(SyncError, match="refused a head"):
                await syncer.fetch(forged, [peer])
            assert syncer.stats.refused["head"] == 1
            with pytest.raises(SyncError, match="no peer gave its chunk table"):
                await syncer.fetch(envelope, [Peer("127.0.0.1", 9)])  # nobody there
            assert "img" not in syncer.store.images


async def test_an_interrupted_sync_resumes_without_fetching_again_what_it_had(tmp_path):
    key = Ed25519PrivateKey.generate()
    data = os.urandom(400_000)
    with trio.fail_after(LIMIT):
        async with serving(tmp_path, "a", key) as (_, a, peer):
            envelope = await add(a, tmp_path, data, "1")
            # 100 kB/s and a bitmap saved every 20 kB: cut off after about 2 s
            syncer = receiver(tmp_path, key, rate=100_000, save_every=20_000)
            with trio.move_on_after(2):
                await syncer.fetch(envelope, [peer])
            before = syncer.stats.bytes_fetched
            assert 0 < before < len(data) and "img" not in syncer.store.images
            again = Syncer(syncer.store)  # as after a restart: a new syncer, the same disk
            got = await again.fetch(envelope, [peer])
            assert got.path.read_bytes() == data and again.stats.resumed == 1
            # the saved chunks were not fetched again (at most what followed the last save)
            assert again.stats.bytes_fetched <= len(data) - before + 20_000 + 16384


async def test_a_head_posted_to_the_lease_holder_is_committed_and_its_chunks_synced(tmp_path):
    key = Ed25519PrivateKey.generate()
    data = os.urandom(200_000)
    with trio.fail_after(LIMIT):
        async with serving(tmp_path, "a", key) as (_, a, peer_a):
            envelope = await add(a, tmp_path, data, "1")  # as a standby would have it
            async with serving(tmp_path, "c", key, peer_a) as (node_c, c, peer_c):
                async with peer_c.request("POST", "/images/_heads", body=envelope) as reply:
                    assert reply.status == 201
                    async for _ in reply.body:
                        pass
                assert node_c.state.get("images", "img@1") == envelope
                # served: adopt (in a worker thread) lists the version before it serves it
                await wait_until(lambda: c.store.served_path("img") is not None,
                                 what="the holder to sync the chunks")  # fmt: skip
                assert c.store.served_path("img").read_bytes() == data
                await c.remove({"name": "img", "version": "1"})
                async with peer_c.request("POST", "/images/_heads", body=envelope) as reply:
                    assert reply.status == 409  # a replayed head does not bring it back
                    async for _ in reply.body:
                        pass
                forged = seal(dataclasses.replace(a.store.images["img"]["1"].head, version="2"),
                              Ed25519PrivateKey.generate())  # fmt: skip
                async with peer_c.request("POST", "/images/_heads", body=forged) as reply:
                    assert reply.status == 403
                    async for _ in reply.body:
                        pass
                assert node_c.state.get("images", "img@2") is None


async def test_a_full_disk_stops_the_sync_cleanly_and_it_resumes_once_there_is_room(
    tmp_path, monkeypatch
):
    import errno

    from plugins.images import sync as sync_module

    key = Ed25519PrivateKey.generate()
    old, new = os.urandom(200_000), os.urandom(300_000)
    with trio.fail_after(LIMIT):
        async with serving(tmp_path, "a", key) as (_, a, peer):
            syncer = receiver(tmp_path, key, save_every=50_000, run_bytes=40_000)
            await syncer.fetch(await add(a, tmp_path, old, "1"), [peer])
            envelope = await add(a, tmp_path, new, "2")
            written = 0
            real_pwrite = os.pwrite

            def filling(fd, data, offset):  # the disk fills after 150 kB
                nonlocal written
                written += len(data)
                if written > 150_000:
                    raise OSError(errno.ENOSPC, "No space left on device")
                return real_pwrite(fd, data, offset)

            monkeypatch.setattr(sync_module.os, "pwrite", filling)
            with pytest.raises(SyncError, match="disk is full"):
                await syncer.fetch(envelope, [peer])
            assert list(syncer.store.images["img"]) == ["1"]  # the old version untouched
            assert syncer.store.verify("img", "1") is None
            fetched = syncer.stats.bytes_fetched
            monkeypatch.setattr(sync_module.os, "pwrite", real_pwrite)
            got = await syncer.fetch(envelope, [peer])
            assert got.path.read_bytes() == new and syncer.stats.resumed == 1
            assert syncer.stats.bytes_fetched - fetched < len(new)  # the saved part stayed


async def test_a_removal_while_a_posted_head_waits_is_not_undone(tmp_path):
    # The holder checks the tombstone and commits under the store lock: an `image rm`
    # holding that lock when the head arrives finishes first, and the head is refused.
    key = Ed25519PrivateKey.generate()
    with trio.fail_after(LIMIT):
        async with serving(tmp_path, "a", key) as (_, a, _peer_a):
            envelope = await add(a, tmp_path, os.urandom(50_000), "1")
            async with serving(tmp_path, "c", key) as (node_c, c, peer_c):
                answers = []

                async def post():
                    async with peer_c.request("POST", "/images/_heads", body=envelope) as reply:
                        async for _ in reply.body:
                            pass
                    answers.append(reply.status)

                # c.lock: as `image rm` holds it while it commits
                async with trio.open_nursery() as nursery, c.lock:
                    nursery.start_soon(post)
                    await wait_until(lambda: c.lock.statistics().tasks_waiting == 1,
                                     what="the POST waiting for the lock")  # fmt: skip
                    assert answers == []
                    await node_c.state.put("images.removed", "img@1", True)
                assert answers == [409]
                assert node_c.state.get("images", "img@1") is None


async def test_two_peers_saving_the_bitmap_at_once_do_not_trip_over_each_other(tmp_path):
    # Each worker saves the bitmap (a temporary file renamed over it) in a thread once
    # enough is unsaved; two workers saving together renamed one temporary file twice
    # (the second rename: "No such file", the sync failed and waited for its retry).
    key = Ed25519PrivateKey.generate()
    data = os.urandom(2_000_000)
    with trio.fail_after(LIMIT):
        async with (
            serving(tmp_path, "a", key) as (_, a, peer_a),
            serving(tmp_path, "c", key) as (_, c, peer_c),
        ):
            envelope = await add(a, tmp_path, data, "1")
            await add(c, tmp_path, data, "1")
            for attempt in range(5):
                syncer = receiver(tmp_path / f"r{attempt}", key, save_every=1, run_bytes=16384)
                got = await syncer.fetch(envelope, [peer_a, peer_c])
                assert got.path.read_bytes() == data
                assert len(syncer.stats.by_peer) == 2  # both worked, saving as they went
