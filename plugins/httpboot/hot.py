"""Small files kept in memory while their name still leads to the same, unchanged file
(filesystem only: no network, no trio; clocks passed in).

A small file (``HOT_FILE_BYTES`` at most) costs more to open, check and read than
to send: the root's ``stat``, ``openat2``, ``fstat``, a file object, ``pread``
and ``close`` (~25 % of a 1 KiB file's request). Kept here, a request costs one
``stat`` of ``ROOT/NAME``, the name resolved by the kernel as it is now:

* **Fresh.** The kept bytes are served only while that ``stat`` finds the same
  device and inode with the same size, ``mtime``, ``ctime`` and one link. A file
  written, truncated, replaced (renamed over), removed, or a name now leading
  elsewhere (a directory or the root swapped, a symlink planted) changes one of
  them: the name goes the full way again. A file changed within
  ``FRESH_SECONDS`` is not kept (a write within the same timestamp tick would
  not show in ``mtime``).
* **Confined.** Only a file opened under the root with ``openat2``
  ``RESOLVE_BENEATH`` (beneath.py) is kept, with one link (no other name
  anywhere leads to it; a new hard link changes its ``ctime``), and the bytes
  are the ones read from that descriptor. A tree changed to lead outside the
  root meets a different inode; the one change a ``stat`` by name cannot see
  (the file's own directory moved out of the root and a symlink put in its
  place: the same inode, through a path now leaving the root) is caught by the
  ``openat2`` done again every ``RECHECK_SECONDS`` (the kept bytes were served
  inside the root until then, and are the same bytes).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from .beneath import BeneathRoot, plain_name
from .conditional import Validators

HOT_FILE_BYTES = 64 << 10  # a bigger file goes by sendfile, from the page cache
MAX_FILES = 1024
MAX_BYTES = 16 << 20
FRESH_SECONDS = 2.0
RECHECK_SECONDS = 1.0


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink


@dataclass
class HotFile:
    path: str  # ROOT/NAME, stat'ed by each request
    identity: tuple[int, ...]
    stat: os.stat_result
    content: bytes
    headers: list[tuple[bytes, bytes]]  # validators, accept-ranges, content-type
    proved: float  # monotonic time of the last openat2 that reached it
    heads: dict[bytes, bytes] = field(default_factory=dict)  # the 200's head by Date


class HotFiles:
    """Small regular files under ``beneath.root`` by the name they were asked by."""

    def __init__(
        self,
        beneath: BeneathRoot,
        content_type: Callable[[str], bytes],
        monotonic: Callable[[], float],
        wall: Callable[[], float],
        fresh_seconds: float = FRESH_SECONDS,
    ) -> None:
        self.beneath = beneath
        self.content_type = content_type
        self.monotonic, self.wall = monotonic, wall
        self.fresh_seconds = fresh_seconds
        self.files: dict[str, HotFile] = {}
        self.bytes = 0

    def get(self, name: str) -> HotFile | None:
        """The kept file ``name`` leads to, if it is still the one kept."""
        hot = self.files.get(name)
        if hot is None:
            return None
        try:
            st = os.stat(hot.path)
        except OSError:
            st = None
        if st is None or _identity(st) != hot.identity:
            self._drop(name)
            return None
        now = self.monotonic()
        if now - hot.proved >= RECHECK_SECONDS:
            opened = self.beneath.open(name)
            if opened is None:
                self._drop(name)
                return None
            handle, again = opened
            handle.close()
            if _identity(again) != hot.identity:
                self._drop(name)
                return None
            hot.proved = now
        return hot

    def keep(self, name: str, handle: BinaryIO, st: os.stat_result) -> HotFile | None:
        """Keep the file ``beneath.open(name)`` just opened, if it may be kept: read it
        (the caller still owns ``handle``)."""
        relative = plain_name(name)
        if (
            relative is None
            or not stat.S_ISREG(st.st_mode)
            or st.st_size > HOT_FILE_BYTES
            or st.st_nlink != 1
            or self.wall() - st.st_ctime < self.fresh_seconds
        ):
            return None
        content = os.pread(handle.fileno(), st.st_size, 0)
        if len(content) != st.st_size or _identity(os.fstat(handle.fileno())) != _identity(st):
            return None  # written meanwhile
        while self.files and (
            len(self.files) >= MAX_FILES or self.bytes + len(content) > MAX_BYTES
        ):
            self._drop(next(iter(self.files)))  # the oldest kept
        validators = Validators.of_file(st.st_size, st.st_mtime_ns, st.st_ino)
        headers = [
            (b"etag", validators.etag),
            (b"last-modified", validators.last_modified),
            (b"accept-ranges", b"bytes"),
            (b"content-type", self.content_type(relative)),
        ]
        path = os.path.join(os.fsdecode(self.beneath.root), relative)
        hot = HotFile(path, _identity(st), st, content, headers, self.monotonic())
        self._drop(name)
        self.files[name] = hot
        self.bytes += len(content)
        return hot

    def _drop(self, name: str) -> None:
        hot = self.files.pop(name, None)
        if hot is not None:
            self.bytes -= len(hot.content)
