"""Cutting a file into content-defined chunks (pyfastcdc) and checking one against its table.

Blocking file work: the plugin runs these in a worker thread. FastCDC's cut
points depend only on the bytes (seed 0, normalized chunking 1) and the
parameters, which every table records: any node cuts the same file the same way.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pyfastcdc import FastCDC

from .manifest import Params, Table


def chunk_file(path: Path, params: Params) -> tuple[Table, bytes]:
    """The chunk table of the file at ``path`` and the SHA-256 of the whole file."""
    whole = hashlib.sha256()
    ids: list[bytes] = []
    sizes: list[int] = []
    if os.path.getsize(path):  # pyfastcdc maps the file: an empty one cannot be mapped
        cutter = FastCDC(params.avg_size, min_size=params.min_size, max_size=params.max_size)
        for chunk in cutter.cut_file(os.fspath(path)):
            ids.append(hashlib.sha256(chunk.data).digest())
            sizes.append(chunk.length)
            whole.update(chunk.data)
    return Table(params, tuple(ids), tuple(sizes)), whole.digest()


def check_file(path: Path, table: Table, sha256: bytes) -> str | None:
    """Why the file at ``path`` is not the image ``table`` and ``sha256`` describe
    (the first chunk that differs, a wrong length, a wrong whole-file digest), or None."""
    whole = hashlib.sha256()
    with open(path, "rb") as f:
        for i, (want, size) in enumerate(zip(table.ids, table.sizes, strict=True)):
            data = f.read(size)
            if len(data) != size:
                return f"the file ends inside chunk {i}"
            if hashlib.sha256(data).digest() != want:
                return f"chunk {i} (at byte {f.tell() - size}) does not match its id"
            whole.update(data)
        if f.read(1):
            return "the file is longer than its chunks"
    if whole.digest() != sha256:
        return "the whole file's SHA-256 does not match the head's"
    return None


_ZEROS: dict[int, bytes] = {}


def zero_id(size: int) -> bytes:
    """The id of ``size`` zero bytes: such a chunk is written, never fetched."""
    found = _ZEROS.get(size)
    if found is None:
        found = _ZEROS[size] = hashlib.sha256(bytes(size)).digest()
    return found
