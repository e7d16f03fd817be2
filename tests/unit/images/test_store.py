"""The image store on disk (plugins/images/store.py): add, verify, remove, gc, crashes."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from plugins.images.manifest import BadManifest, Params, public_raw, seal
from plugins.images.store import ImageError, ImageStore

PARAMS = Params(1024, 4096, 16384)


def make(tmp_path: Path, key: Ed25519PrivateKey | None = None) -> tuple[ImageStore, callable]:
    key = key or Ed25519PrivateKey.generate()

    def trust(cert_der, public, head):
        if cert_der or public != public_raw(key.public_key()):
            raise BadManifest("signed by another node's local key")
        return key.public_key()

    def sealer(head):
        return seal(dataclasses.replace(head, signer="local:test"), key)

    store = ImageStore(tmp_path / "store", trust)
    store.load()
    return store, sealer


def image(path: Path, size: int, seed: int = 1) -> Path:
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


def test_add_cuts_copies_signs_and_serves_the_newest(tmp_path):
    store, sealer = make(tmp_path)
    src = image(tmp_path / "a.img", 300_000)
    first = store.add("ubuntu", src, None, PARAMS, sealer, now=1.0)
    assert first.head.version == "1" and first.head.signer == "local:test"
    assert first.path.read_bytes() == src.read_bytes()
    assert oct(first.path.stat().st_mode & 0o777) == "0o444"
    src.write_bytes(src.read_bytes()[:1000] + b"edit" + src.read_bytes()[1000:])
    second = store.add("ubuntu", src, None, PARAMS, sealer, now=2.0)
    assert second.head.version == "2" and store.served_path("ubuntu") == second.path
    assert (store.root / "current" / "ubuntu").resolve() == second.path.resolve()
    # content-defined: the edit near the start changed a chunk or two, the rest is shared
    shared = set(first.table.ids) & set(second.table.ids)
    assert len(shared) >= len(second.table.ids) - 3
    assert store.verify("ubuntu") is None and store.verify("ubuntu", "1") is None
    with pytest.raises(ImageError, match="exists"):
        store.add("ubuntu", src, "2", PARAMS, sealer, now=3.0)


def test_everything_survives_a_restart_and_a_foreign_head_is_refused(tmp_path):
    store, sealer = make(tmp_path)
    key = Ed25519PrivateKey.generate()
    src = image(tmp_path / "a.img", 100_000)
    store.add("ipxe", src, "7", PARAMS, sealer, now=1.0)
    again, _ = make(tmp_path, key)  # another key: this store's own heads are not its
    assert again.images == {} and len(again.problems) == 1 and "another node" in again.problems[0]
    store.load()
    assert list(store.images["ipxe"]) == ["7"] and store.current == {"ipxe": "7"}


def test_a_damaged_file_is_found_by_verify(tmp_path):
    store, sealer = make(tmp_path)
    found = store.add("k", image(tmp_path / "a.img", 200_000), None, PARAMS, sealer, now=1.0)
    os.chmod(found.path, 0o644)
    with open(found.path, "r+b") as f:
        f.seek(150_000)
        f.write(b"\xff")
    assert "does not match its id" in store.verify("k")
    os.truncate(found.path, 100)
    store.load()  # a file of the wrong length is not served at all
    assert "k" not in store.images and "100 bytes" in store.problems[0]


def test_a_crash_before_the_head_leaves_nothing_served_and_gc_cleans_up(tmp_path):
    store, sealer = make(tmp_path)
    store.add("a", image(tmp_path / "a.img", 50_000), None, PARAMS, sealer, now=1.0)
    # as if the process died after renaming a file in, before its head was written
    orphan = store.root / "files" / "a" / "9"
    orphan.write_bytes(b"half")
    (store.root / "tmp" / "b@1.123").write_bytes(b"copying")
    store.load()
    assert list(store.images["a"]) == ["1"] and not (store.root / "tmp" / "b@1.123").exists()
    removed = store.gc(keep=2)
    assert removed == ["orphan file files/a/9"] and not orphan.exists()


def test_gc_keeps_the_current_and_the_newest_and_drops_unused_tables(tmp_path):
    store, sealer = make(tmp_path)
    src = tmp_path / "a.img"
    for n in range(4):
        store.add("a", image(src, 40_000, seed=n), None, PARAMS, sealer, now=float(n))
    store._set_current("a", "2")  # an operator pinned an older version
    assert sorted(store.gc(keep=2)) == ["a@1", "a@3"]
    assert sorted(store.images["a"]) == ["2", "4"] and store.current["a"] == "2"
    assert len(list((store.root / "tables").iterdir())) == 2
    store.remove("a", "2")  # the current one goes: the newest left is served
    assert store.current["a"] == "4"
    store.remove("a", "4")
    assert "a" not in store.images and not (store.root / "current" / "a").exists()


def test_the_index_finds_every_chunk_and_an_empty_image_works(tmp_path):
    store, sealer = make(tmp_path)
    found = store.add("a", image(tmp_path / "a.img", 120_000), None, PARAMS, sealer, now=1.0)
    data = found.path.read_bytes()
    for chunk in found.table.ids:
        loc = store.index[chunk]
        assert loc.path == found.path
        assert hashlib.sha256(data[loc.offset : loc.offset + loc.size]).digest() == chunk
    empty = store.add("e", image(tmp_path / "e.img", 0), None, PARAMS, sealer, now=2.0)
    assert empty.head.size == 0 and empty.head.chunks == 0 and store.verify("e") is None


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "x" * 65])
def test_names_that_could_escape_the_store_are_refused(tmp_path, name):
    store, sealer = make(tmp_path)
    with pytest.raises(ImageError, match="image name"):
        store.add(name, image(tmp_path / "a.img", 10), None, PARAMS, sealer, now=1.0)


def test_partial_files_of_versions_no_longer_committed_are_pruned(tmp_path):
    store, _ = make(tmp_path)
    for name, version in (("ubuntu", "2"), ("ubuntu", "3.done"), ("debian", "1.2")):
        partial = store.partial_path(name, version)
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(b"half")
        partial.with_name(partial.name + ".done").write_bytes(b"\x01")
    store.partial_path("ubuntu", "2").with_name("2.done.tmp").write_bytes(b"\x01")
    # ubuntu@2 removed in the rack, the others still committed (a version may hold dots)
    removed = store.prune_partials({"ubuntu@3.done", "debian@1.2", "other@1"})
    assert sorted(removed) == ["partial partial/ubuntu/2", "partial partial/ubuntu/2.done",
                               "partial partial/ubuntu/2.done.tmp"]  # fmt: skip
    left = sorted(str(p.relative_to(store.root)) for p in (store.root / "partial").glob("*/*"))
    assert left == ["partial/debian/1.2", "partial/debian/1.2.done",
                    "partial/ubuntu/3.done", "partial/ubuntu/3.done.done"]  # fmt: skip
