"""A served file opened in one system call, the kernel keeping it under the root: the
fast path of ``appliance.confine.open_confined`` (filesystem only, no network, no clock).

``open_confined`` resolves a name with an ``lstat`` per component, twice (the root
and the file), then opens, ``fstat``s and reads ``/proc/self/fd`` back: some twenty
system calls and ~90 µs for each small file. ``openat2(2)`` with
``RESOLVE_BENEATH`` resolves the name relative to a descriptor of the root and
fails (``EXDEV``) as soon as a ``..``, an absolute symlink or a magic link would
leave it, atomically: a symlink swapped during the resolution cannot lead it out.

Only a *success* is decided here: an open regular file under the root, which
``open_confined`` would serve too (inside the real root, regular). Everything
else (a name it refuses outright, a missing file, anything ``openat2`` refuses
or fails on, a non-regular file, a kernel without ``openat2``) returns None and
the caller asks ``open_confined``, whose answer (404, 403) stays the only one.
What it serves differently: nothing, except that a symlink pointing at an
absolute path inside the root goes the slow way.

The root's descriptor is kept while the root's path still names the same directory
(device and inode, one ``stat`` per request): a root that is a symlink repointed
to a new tree, or a directory replaced, is reopened at the next request.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

SYS_OPENAT2 = 437  # the same number on every architecture (Linux 5.6+)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO swapped in never blocks
ROOT_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _syscall():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    return call


_SYSCALL = _syscall()
_HOW = _OpenHow(FILE_FLAGS, 0, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
_HOW_REF, _HOW_SIZE = ctypes.byref(_HOW), ctypes.sizeof(_HOW)


def plain_name(requested: str) -> str | None:
    """The name relative to the root, if ``open_confined`` would resolve it at all."""
    relative = requested.lstrip("/")
    if not relative or "\0" in requested or "\\" in requested or ".." in relative.split("/"):
        return None
    return relative


class BeneathRoot:
    """Opens regular files under ``root`` with ``openat2`` while the kernel has it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.available = _SYSCALL is not None
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the root's fd

    def open(self, requested: str) -> tuple[BinaryIO, os.stat_result] | None:
        """The open regular file and its ``fstat``, or None: ``open_confined`` decides."""
        relative = plain_name(requested) if self.available else None
        dirfd = self._root_fd() if relative is not None else None
        if dirfd is None or relative is None:
            return None
        fd = _SYSCALL(SYS_OPENAT2, dirfd, os.fsencode(relative), _HOW_REF, _HOW_SIZE)
        if fd < 0:
            if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):  # no openat2 (or seccomp)
                self.available = False
            return None
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                return io.FileIO(fd, "rb"), st  # what os.fdopen(fd, "rb", buffering=0) is
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    def _root_fd(self) -> int | None:
        """The root's descriptor, reopened if its path names another directory now."""
        try:
            st = os.stat(self.root)
        except OSError:
            return None
        if self._fd is not None and self._identity == (st.st_dev, st.st_ino):
            return self._fd
        self.close()
        try:
            fd = os.open(self.root, ROOT_FLAGS)
        except OSError:
            return None
        held = os.fstat(fd)
        self._fd, self._identity = fd, (held.st_dev, held.st_ino)
        # Swapped between the stat and the open: the next request checks again.
        return fd if self._identity == (st.st_dev, st.st_ino) else None

    def __del__(self) -> None:
        self.close()

    def close(self, _close: Callable[[int], None] = os.close) -> None:
        # Bound at definition: __del__ may run at interpreter exit, after the module's
        # globals (os, contextlib) were cleared.
        fd, self._fd, self._identity = self._fd, None, None
        if fd is not None:
            try:
                _close(fd)
            except OSError:
                pass
