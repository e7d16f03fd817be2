"""Boot images in a rack in network namespaces (issue 17): two (and three) appliances and
a witness, real `rackboot run` processes with the httpboot and images plugins.

An image added on the active is committed to the rack's state log, reaches the
standby with it, and the standby assembles it from the active's HTTP server; a
new version moves only the chunks around the edit. The standby is killed with
SIGKILL in the middle of a (rate-limited) sync and restarted: it resumes and
fetches less than the whole image again. An image added on the standby is
committed through the active, which syncs it from the standby. Of three appliances,
one down while the others sync comes back and fetches from both at once, then refuses
the chunks of a copy damaged on one standby's disk. Every wait bounded.
"""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

import pytest

from appliance import control
from appliance.errors import RackbootError
from tests.support.dhcplab import stop_process, wait_until
from tests.support.ha_lab import Rack

SIZE = 256 << 20
RATE = 64 << 20  # bytes/s a sync may fetch: a 256 MiB sync takes 4 s, long enough to kill
IMAGES = f"""
[httpboot]
port = 80
[images]
max_rate = {RATE}
"""


@pytest.fixture
def image_rack(lab, tmp_path):
    made = Rack(lab, tmp_path, dhcp=IMAGES, disabled=("tftp",))
    try:
        yield made.start()
    finally:
        made.close()


def image_file(path: Path, size: int, seed: int) -> Path:
    with path.open("wb") as f:  # random runs and zero runs, in 1 MiB steps
        rng = __import__("random").Random(seed)
        for i in range(size >> 20):
            f.write(rng.randbytes(1 << 20) if i % 4 else bytes(1 << 20))
    return path


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def images(node) -> dict:
    return node.status()["images"]


def call(node, cmd: str, **args):
    return control.call(node.socket, cmd, args, timeout=120.0)  # adding 256 MiB takes seconds


def test_an_image_reaches_the_standby_an_edit_moves_little_and_a_killed_sync_resumes(
    image_rack: Rack, tmp_path: Path
):
    rack = image_rack
    (active_name,) = rack.actives()
    standby_name = "b" if active_name == "a" else "a"
    active, standby = rack.nodes[active_name], rack.nodes[standby_name]
    src = image_file(tmp_path / "v1.img", SIZE, 1)

    added = call(active, "images.add", name="debian", file=str(src))
    assert added["committed"] is True
    wait_until(lambda: images(standby)["images"].get("debian") == "1", 30,
               "the standby to assemble debian@1", detail=rack.logs)  # fmt: skip
    path = Path(call(standby, "images.show", name="debian")["path"])
    assert sha(path) == sha(src)
    first = images(standby)["sync"]
    assert first["chunks_zero"] > 0 and first["bytes_fetched"] < SIZE  # zero chunks stay local

    # an edit: 1 MiB overwritten in the middle; only the chunks around it move
    with src.open("r+b") as f:
        f.seek(SIZE // 2 + 36 * 1024)
        f.write(os.urandom(1 << 20))
    call(active, "images.add", name="debian", file=str(src))
    wait_until(lambda: images(standby)["images"].get("debian") == "2", 30,
               "the standby to assemble debian@2", detail=rack.logs)  # fmt: skip
    moved = images(standby)["sync"]["bytes_fetched"] - first["bytes_fetched"]
    assert moved < (1 << 20) + 2 * (256 << 10), moved

    # a new image, the standby killed in the middle of its sync, then restarted
    other = image_file(tmp_path / "other.img", SIZE, 2)
    call(active, "images.add", name="other", file=str(other))
    wait_until(lambda: images(standby)["sync"]["bytes_fetched"] - first["bytes_fetched"] - moved
               > 100 << 20, 30, "the standby's sync under way", detail=rack.logs)  # fmt: skip
    os.kill(standby.proc.pid, signal.SIGKILL)
    standby.proc.wait(10)
    standby.start(timeout=60)
    wait_until(lambda: images(standby)["images"].get("other") == "1", 30,
               "the restarted standby to finish the sync", detail=rack.logs)  # fmt: skip
    after = images(standby)["sync"]
    assert after["resumed"] == 1
    # a quarter is zeros (never fetched); of the rest, what was saved is not fetched again
    assert after["bytes_fetched"] < SIZE * 3 // 4, after
    assert sha(Path(call(standby, "images.show", name="other")["path"])) == sha(other)


def test_an_image_added_on_the_standby_is_committed_by_the_active(image_rack: Rack, tmp_path):
    rack = image_rack
    (active_name,) = rack.actives()
    standby = rack.nodes["b" if active_name == "a" else "a"]
    active = rack.nodes[active_name]
    src = image_file(tmp_path / "s.img", 16 << 20, 3)
    added = call(standby, "images.add", name="tools", file=str(src))
    assert added["committed"] is True and added["committed_by"].startswith(
        rack.hosts[active_name].addr
    )
    wait_until(lambda: images(active)["images"].get("tools") == "1", 30,
               "the active to sync the standby's image", detail=rack.logs)  # fmt: skip
    assert sha(Path(call(active, "images.show", name="tools")["path"])) == sha(src)
    with pytest.raises(RackbootError, match="run it on the active"):  # removing is the rack's
        call(standby, "images.rm", name="tools", version="1")


@pytest.fixture
def three_rack(lab, tmp_path):
    made = Rack(lab, tmp_path, dhcp="[httpboot]\nport = 80\n", disabled=("tftp",), appliances=3)
    try:
        yield made.start()
    finally:
        made.close()


def test_three_appliances_a_late_one_syncs_from_both_others_and_refuses_a_corrupted_copy(
    three_rack: Rack, tmp_path: Path
):
    """Two standbys assemble an image; a third appliance, down meanwhile, syncs it from
    both at once; then the copy of one standby is damaged on its disk, and the third
    refuses that standby's chunks and takes them from the active."""
    rack = three_rack
    (active_name,) = rack.actives()
    late_name = next(n for n in rack.nodes if n != active_name)
    early_name = next(n for n in rack.nodes if n not in (active_name, late_name))
    active, early, late = (rack.nodes[n] for n in (active_name, early_name, late_name))
    stop_process(late.proc, signal.SIGTERM, 10)

    src = image_file(tmp_path / "v1.img", SIZE, 4)
    assert call(active, "images.add", name="debian", file=str(src))["committed"] is True
    wait_until(lambda: images(early)["images"].get("debian") == "1", 30,
               "the first standby to assemble debian@1", detail=rack.logs)  # fmt: skip
    late.start(timeout=60)
    wait_until(lambda: images(late)["images"].get("debian") == "1", 30,
               "the late appliance to assemble debian@1", detail=rack.logs)  # fmt: skip
    assert sha(Path(call(late, "images.show", name="debian")["path"])) == sha(src)
    by_peer = images(late)["sync"]["by_peer"]
    sources = {f"{rack.hosts[n].addr}:80" for n in (active_name, early_name)}
    assert set(by_peer) == sources and all(by_peer.values()), by_peer  # both gave chunks

    stop_process(late.proc, signal.SIGTERM, 10)
    other = image_file(tmp_path / "other.img", 64 << 20, 5)
    assert call(active, "images.add", name="other", file=str(other))["committed"] is True
    wait_until(lambda: images(early)["images"].get("other") == "1", 30,
               "the first standby to assemble other@1", detail=rack.logs)  # fmt: skip
    damaged = Path(call(early, "images.show", name="other")["path"])
    with damaged.open("r+b") as f:  # a byte flipped in every MiB: each run it serves is bad
        for offset in range(4096, 64 << 20, 1 << 20):
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))
    late.start(timeout=60)
    wait_until(lambda: images(late)["images"].get("other") == "1", 30,
               "the late appliance to assemble other@1", detail=rack.logs)  # fmt: skip
    assert sha(Path(call(late, "images.show", name="other")["path"])) == sha(other)
    sync = images(late)["sync"]
    assert sync["refused"].get("chunk", 0) >= 1, sync
    assert f"{rack.hosts[early_name].addr}:80" not in sync["by_peer"], sync  # nothing kept
