"""bench/sync/edits.py: the image generator and the three edits, on a few MiB."""

from __future__ import annotations

import pytest

from bench.sync import edits
from bench.sync.edits import MIB

SIZE = 4 * MIB


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "v1.img"
    edits.write_image(path, SIZE, seed=3)
    return path


def test_image_is_deterministic_per_seed(tmp_path, base):
    again, other = tmp_path / "again.img", tmp_path / "other.img"
    edits.write_image(again, SIZE, seed=3)
    edits.write_image(other, SIZE, seed=4)
    assert base.stat().st_size == SIZE
    assert again.read_bytes() == base.read_bytes()
    assert other.read_bytes() != base.read_bytes()


def test_image_follows_its_plan(base):
    """Zero runs are zeros, repeat runs one 4 KiB block, text the alphabet, data not."""
    data = base.read_bytes()
    plan = list(edits.segments(3, 64 * MIB))  # a longer plan has the same start
    pos = 0
    seen = set()
    for kind, length in plan:
        if pos >= SIZE:
            break
        chunk = data[pos : min(pos + length, SIZE)]
        seen.add(kind)
        if kind == "zero":
            assert chunk == bytes(len(chunk))
        elif kind == "repeat":
            assert chunk == chunk[: edits.BLOCK] * (len(chunk) // edits.BLOCK)
        elif kind == "text":
            assert set(chunk) <= set(edits.TEXT)
        else:
            assert chunk.count(0) < len(chunk) // 64
        pos += length
    assert pos >= SIZE
    total = sum(length for _, length in edits.segments(3, SIZE))
    assert total == SIZE
    shares = edits.composition(3, 64 * MIB)
    assert shares["data"] > 0 and shares["zero"] > 0


def test_image_is_a_mix_at_scale():
    shares = edits.composition(edits.DEFAULT_SEED, 1024 * MIB)
    assert 0.5 < shares["data"] < 0.75
    assert 0.15 < shares["zero"] < 0.4
    assert shares["repeat"] > 0.02 and shares["text"] > 0.02


def test_image_size_is_checked(tmp_path):
    with pytest.raises(ValueError):
        edits.write_image(tmp_path / "x", 1000)


def test_overwrite_changes_exactly_its_range(tmp_path, base):
    dst = tmp_path / "v2.img"
    offset = SIZE // 2 + 12_345
    ranges = edits.overwrite(base, dst, offset, MIB, seed=9)
    assert ranges == [(offset, MIB)]
    old, new = base.read_bytes(), dst.read_bytes()
    assert len(new) == len(old)
    assert new[:offset] == old[:offset]
    assert new[offset + MIB :] == old[offset + MIB :]
    assert new[offset : offset + MIB] == edits.random_bytes(9, f"overwrite:{offset}:{MIB}", MIB)
    # new bytes: almost every byte differs from what was there
    pairs = zip(new[offset : offset + MIB], old[offset : offset + MIB], strict=True)
    changed = sum(a != b for a, b in pairs)
    assert changed > MIB * 0.9
    again = tmp_path / "again.img"
    edits.overwrite(base, again, offset, MIB, seed=9)
    assert again.read_bytes() == new
    with pytest.raises(ValueError):
        edits.overwrite(base, tmp_path / "bad", SIZE - 10, MIB, seed=9)


def test_insert_shifts_everything_after(tmp_path, base):
    dst = tmp_path / "v3.img"
    data = edits.insert_data(5)
    assert len(data) == 1000 and edits.insert_data(5) == data and edits.insert_data(6) != data
    ranges = edits.insert(base, dst, edits.INSERT_OFFSET, data)
    assert ranges == [(edits.INSERT_OFFSET, 1000)]
    old, new = base.read_bytes(), dst.read_bytes()
    off = edits.INSERT_OFFSET
    assert len(new) == len(old) + 1000
    assert new[:off] == old[:off]
    assert new[off : off + 1000] == data
    assert new[off + 1000 :] == old[off:]
    # at both ends too
    edits.insert(base, tmp_path / "head", 0, b"xy")
    assert (tmp_path / "head").read_bytes() == b"xy" + old
    edits.insert(base, tmp_path / "tail", SIZE, b"xy")
    assert (tmp_path / "tail").read_bytes() == old + b"xy"
    with pytest.raises(ValueError):
        edits.insert(base, tmp_path / "bad", SIZE + 1, b"x")


def test_scatter_writes_exactly_its_blocks(tmp_path, base):
    dst = tmp_path / "v4.img"
    ranges = edits.scatter(base, dst, 20, 4096, seed=11)
    offsets = [off for off, _ in ranges]
    assert len(ranges) == 20 and all(size == 4096 for _, size in ranges)
    assert offsets == sorted(set(offsets))
    assert all(off % 4096 == 0 and off + 4096 <= SIZE for off in offsets)
    assert offsets == edits.scatter_offsets(SIZE, 20, 4096, 11)
    assert offsets != edits.scatter_offsets(SIZE, 20, 4096, 12)
    old, new = base.read_bytes(), dst.read_bytes()
    assert len(new) == len(old)
    written = set()
    for off in offsets:
        written.update(range(off, off + 4096))
        assert new[off : off + 4096] != old[off : off + 4096]
    # everything else identical: compare the stretches between the writes
    edges = [0, *[e for off in offsets for e in (off, off + 4096)], SIZE]
    for start, end in zip(edges[::2], edges[1::2], strict=True):
        assert new[start:end] == old[start:end]
    again = tmp_path / "again.img"
    edits.scatter(base, again, 20, 4096, seed=11)
    assert again.read_bytes() == new
    with pytest.raises(ValueError):
        edits.scatter(base, tmp_path / "bad", SIZE // 4096 + 1, 4096, seed=1)


def test_versions_chain(tmp_path):
    versions = edits.build_versions(tmp_path / "v", SIZE, seed=2)
    assert [v.edit for v in versions.values()] == ["base", "overwrite", "insert", "scatter"]
    v1, v2, v3, v4 = (versions[n].path.read_bytes() for n in ("v1", "v2", "v3", "v4"))
    assert all(versions[n].path.name == "boot.img" for n in versions)
    mid = edits.overwrite_offset(SIZE)
    assert mid % 4096 == 0 and mid % 32768 != 0
    assert versions["v2"].ranges == [(mid, MIB)]
    assert v2[:mid] == v1[:mid] and v2[mid + MIB :] == v1[mid + MIB :] and v2 != v1
    off = edits.INSERT_OFFSET
    assert v3[:off] == v2[:off] and v3[off + 1000 :] == v2[off:]
    assert len(v4) == len(v3) == SIZE + 1000
    differ = [i for i in range(0, len(v4), 4096) if v4[i : i + 4096] != v3[i : i + 4096]]
    assert differ == [off for off, _ in versions["v4"].ranges]
    mtimes = [versions[n].path.stat().st_mtime for n in versions]
    assert mtimes == sorted(set(mtimes))
    assert versions["v4"].sha256 == edits.sha256_file(versions["v4"].path)
    again = edits.build_versions(tmp_path / "again", SIZE, seed=2)
    assert [v.sha256 for v in again.values()] == [v.sha256 for v in versions.values()]


RSYNC_STATS = """
Number of files: 1 (reg: 1)
Number of created files: 0
Number of deleted files: 0
Number of regular files transferred: 1
Total file size: 67,109,864 bytes
Total transferred file size: 67,109,864 bytes
Literal data: 1,000 bytes
Matched data: 67,108,864 bytes
File list size: 51
File list generation time: 0.001 seconds
File list transfer time: 0.000 seconds
Total bytes sent: 57,387
Total bytes received: 33,869

sent 57,387 bytes  received 33,869 bytes  60,837.33 bytes/sec
total size is 67,109,864  speedup is 735.38
"""


def test_rsync_stats_are_parsed():
    from bench.sync.cli import parse_stats

    assert parse_stats(RSYNC_STATS) == {
        "literal_data": 1000,
        "matched_data": 67_108_864,
        "bytes_sent": 57_387,
        "bytes_received": 33_869,
        "file_list_size": 51,
        "transferred_file_size": 67_109_864,
    }
    with pytest.raises(RuntimeError):
        parse_stats("sent 1 bytes  received 2 bytes")
