"""The boot image of ``python -m bench.sync`` and the three edits that make its versions.

Pure: no I/O beyond the files it is given, nothing random that a seed does not fix.

The image looks like a disk image rather than noise: 4 KiB-aligned segments of
random bytes (compressed kernels, initrds, squashfs: incompressible), runs of zeros
(a sparse filesystem's free space), a 4 KiB block repeated (tables, padding) and
text-like bytes (configuration, scripts: a 32-letter alphabet). About 60 % / 30 % /
5 % / 5 % of the bytes (:func:`composition` tells exactly). It is written in 1 MiB
steps: never the whole image in memory.

The versions an operator would publish, each from the previous one::

    v1 (the base) --overwrite--> v2 --insert--> v3 --scatter--> v4

* ``overwrite``: 1 MiB of new bytes at the middle of the image + 36 KiB (same size);
* ``insert``: 1,000 new bytes at 66,000 (~64 KiB): everything after shifts by 1,000;
* ``scatter``: 20 new 4 KiB blocks at seeded, 4 KiB-aligned, distinct offsets.

The random bytes are an AES-128-CTR keystream keyed by (seed, purpose): fast
(GB/s) and the same on every machine.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

MIB = 1 << 20
KIB = 1 << 10
BLOCK = 4096  # segments and scattered writes are aligned to it, as a filesystem's blocks
DEFAULT_SEED = 17  # issue 17

# Offsets on no power-of-two boundary above 4 KiB: an edit aligned to a sync's block
# size (rsync's is sqrt(size) rounded, 32 KiB for 1 GiB) would flatter it.
OVERWRITE_LENGTH = MIB
OVERWRITE_PAST_MIDDLE = 36 * KIB  # the overwrite starts here past the middle: 4 KiB-aligned
INSERT_OFFSET = 66_000  # ~64 KiB, inside a file rather than at a block's start
INSERT_LENGTH = 1000
SCATTER_COUNT = 20
SCATTER_SIZE = 4096

# kind: (weight of a segment being this kind, shortest, longest); lengths log-uniform.
# The weights give ~60 % data, ~30 % zeros, ~5 % repeated blocks, ~5 % text by bytes.
SEGMENTS = {
    "data": (0.20, 64 * KIB, 8 * MIB),
    "zero": (0.06, 64 * KIB, 16 * MIB),
    "repeat": (0.15, 16 * KIB, 1 * MIB),
    "text": (0.59, 4 * KIB, 256 * KIB),
}
TEXT = b"etaoinshrdlucmfwypvbgkqjxz _-./\n"  # 32 letters: ~5 bits of entropy a byte
TEXT_TABLE = bytes(TEXT[i % len(TEXT)] for i in range(256))
ZEROS = bytes(MIB)
BASE_MTIME = 1_790_000_000  # v1's modification time; each later version one hour later


def keystream(seed: int, purpose: str):
    """An AES-CTR encryptor whose ``update(zeros)`` is the (seed, purpose) byte stream."""
    key = hashlib.sha256(f"rackboot-bench-sync:{seed}:{purpose}".encode()).digest()[:16]
    return Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()


def random_bytes(seed: int, purpose: str, n: int) -> bytes:
    """``n`` seeded bytes (for edits: at most a few MiB)."""
    return keystream(seed, purpose).update(bytes(n))


def _stream(ks, n: int) -> bytes:
    return ks.update(ZEROS[:n] if n <= MIB else bytes(n))


def segments(seed: int, size: int) -> Iterator[tuple[str, int]]:
    """The image's plan: (kind, length) in order, the lengths adding up to ``size``."""
    rng = random.Random(f"segments:{seed}")
    kinds = list(SEGMENTS)
    weights = [SEGMENTS[k][0] for k in kinds]
    left = size
    while left > 0:
        kind = rng.choices(kinds, weights)[0]
        _, lo, hi = SEGMENTS[kind]
        length = int(lo * (hi / lo) ** rng.random()) // BLOCK * BLOCK
        length = min(max(length, BLOCK), left)
        yield kind, length
        left -= length


def _pieces(seed: int, size: int) -> Iterator[bytes]:
    """The image's bytes, in pieces of at most 1 MiB."""
    ks = keystream(seed, "image")
    for kind, length in segments(seed, size):
        if kind == "repeat":
            pattern = _stream(ks, BLOCK)
            per = MIB // BLOCK
        for start in range(0, length, MIB):
            n = min(MIB, length - start)
            if kind == "data":
                yield _stream(ks, n)
            elif kind == "zero":
                yield ZEROS[:n]
            elif kind == "repeat":
                yield (pattern * per)[:n]
            else:
                yield _stream(ks, n).translate(TEXT_TABLE)


def composition(seed: int, size: int) -> dict[str, float]:
    """Share of the image's bytes per segment kind (and the segment count)."""
    out = dict.fromkeys(SEGMENTS, 0.0)
    count = 0
    for kind, length in segments(seed, size):
        out[kind] += length / size
        count += 1
    return {**{k: round(v, 4) for k, v in out.items()}, "segments": count}


def write_image(path: Path, size: int, seed: int = DEFAULT_SEED) -> None:
    """Write the base image (``size`` bytes, a multiple of 4 KiB) in 1 MiB writes."""
    if size <= 0 or size % BLOCK:
        raise ValueError(f"image size must be a positive multiple of {BLOCK}: {size}")
    buf = bytearray()
    with path.open("wb") as f:
        for piece in _pieces(seed, size):
            buf += piece
            if len(buf) >= MIB:
                f.write(buf[:MIB])
                del buf[:MIB]
        if buf:
            f.write(buf)


def _copy(fin, fout, n: int) -> None:
    """Copy ``n`` bytes from ``fin``'s position to ``fout``'s, 1 MiB at a time."""
    buf = bytearray(MIB)
    view = memoryview(buf)
    while n > 0:
        got = fin.readinto(view[: min(MIB, n)])
        if not got:
            raise ValueError("source file ended early")
        fout.write(view[:got])
        n -= got


def overwrite(src: Path, dst: Path, offset: int, length: int, seed: int) -> list[tuple[int, int]]:
    """``dst`` = ``src`` with [offset, offset + length) replaced by seeded bytes.

    Returns the changed ranges of ``dst``: ``[(offset, length)]``.
    """
    size = src.stat().st_size
    if offset < 0 or length <= 0 or offset + length > size:
        raise ValueError(f"overwrite [{offset}, +{length}) outside a {size}-byte file")
    shutil.copyfile(src, dst)
    with dst.open("r+b") as f:
        f.seek(offset)
        f.write(random_bytes(seed, f"overwrite:{offset}:{length}", length))
    return [(offset, length)]


def overwrite_offset(size: int) -> int:
    """Where the ``overwrite`` edit of a ``size``-byte image starts: in the middle."""
    return size // 2 + OVERWRITE_PAST_MIDDLE


def insert_data(seed: int, length: int = INSERT_LENGTH) -> bytes:
    """The inserted bytes of the ``insert`` edit."""
    return random_bytes(seed, "insert", length)


def insert(src: Path, dst: Path, offset: int, data: bytes) -> list[tuple[int, int]]:
    """``dst`` = ``src[:offset] + data + src[offset:]``: everything after shifts.

    Returns ``[(offset, len(data))]``: the new bytes' range in ``dst``.
    """
    size = src.stat().st_size
    if not 0 <= offset <= size:
        raise ValueError(f"insert at {offset} outside a {size}-byte file")
    with src.open("rb") as fin, dst.open("wb") as fout:
        _copy(fin, fout, offset)
        fout.write(data)
        _copy(fin, fout, size - offset)
    return [(offset, len(data))]


def scatter_offsets(file_size: int, count: int, size: int, seed: int) -> list[int]:
    """``count`` distinct ``size``-aligned offsets of whole ``size`` blocks, ascending."""
    blocks = file_size // size
    if count > blocks:
        raise ValueError(f"{count} writes of {size} bytes do not fit in {file_size} bytes")
    rng = random.Random(f"scatter:{seed}")
    return sorted(b * size for b in rng.sample(range(blocks), count))


def scatter(
    src: Path, dst: Path, count: int = SCATTER_COUNT, size: int = SCATTER_SIZE, *, seed: int
) -> list[tuple[int, int]]:
    """``dst`` = ``src`` with ``count`` seeded ``size``-byte writes at seeded offsets.

    Returns the written ranges ``[(offset, size), ...]`` in ascending order.
    """
    offsets = scatter_offsets(src.stat().st_size, count, size, seed)
    shutil.copyfile(src, dst)
    ks = keystream(seed, f"scatter:{count}:{size}")
    with dst.open("r+b") as f:
        for off in offsets:
            f.seek(off)
            f.write(ks.update(bytes(size)))
    return [(off, size) for off in offsets]


@dataclass
class Version:
    """One published version of the image."""

    name: str  # v1 .. v4
    path: Path
    edit: str  # "base", "overwrite", "insert", "scatter"
    ranges: list[tuple[int, int]] = field(default_factory=list)  # what the edit wrote
    size: int = 0
    sha256: str = ""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def build_versions(
    directory: Path, size: int, seed: int = DEFAULT_SEED, name: str = "boot.img"
) -> dict[str, Version]:
    """Write ``directory/v1/name`` .. ``directory/v4/name``: the base and each edit.

    Every version gets its own modification time (the base ``BASE_MTIME``, each
    next one an hour later), so a size + mtime quick check never mistakes one for
    another: the overwrite and scatter keep the size.
    """
    paths = {v: directory / v / name for v in ("v1", "v2", "v3", "v4")}
    for p in paths.values():
        p.parent.mkdir(parents=True, exist_ok=True)
    write_image(paths["v1"], size, seed)
    versions = {"v1": Version("v1", paths["v1"], "base", [(0, size)])}
    ranges = overwrite(paths["v1"], paths["v2"], overwrite_offset(size), OVERWRITE_LENGTH, seed)
    versions["v2"] = Version("v2", paths["v2"], "overwrite", ranges)
    ranges = insert(paths["v2"], paths["v3"], INSERT_OFFSET, insert_data(seed))
    versions["v3"] = Version("v3", paths["v3"], "insert", ranges)
    ranges = scatter(paths["v3"], paths["v4"], SCATTER_COUNT, SCATTER_SIZE, seed=seed)
    versions["v4"] = Version("v4", paths["v4"], "scatter", ranges)
    for i, v in enumerate(versions.values()):
        os.utime(v.path, (BASE_MTIME + 3600 * i, BASE_MTIME + 3600 * i))
        v.size = v.path.stat().st_size
        v.sha256 = sha256_file(v.path)
    return versions
