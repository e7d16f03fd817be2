"""What a transfer reads from: a file streamed in read-ahead chunks, or bytes in memory.

The transfer machine calls ``read(offset, size)`` synchronously, always
sequentially, from the pump thread (``pump.py``). Before pulling the machine
the pump checks ``short_of(need)``; when fewer than ``need`` bytes are
buffered it first tries ``fill_nowait``, a read of the next chunk (1 MiB, or
more for a large window) that only copies from the page cache
(``RWF_NOWAIT``) and so never waits for the disk. When the bytes are not
cached (or the filesystem cannot say, like tmpfs) the trio side awaits
``prefetch(need)``, which reads in a worker thread (``trio.to_thread``). A file
is never read whole.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import trio

from .confine import Refused, open_confined
from .packets import ErrorCode

CHUNK = 1 << 20  # bytes per read-ahead


class Source:
    """Bytes of one file for one transfer. Used by one thread at a time: the pump, or
    the trio side while the pump waits for its ``prefetch``."""

    def __init__(self, size: int, *, fd: int | None = None, data: bytes = b"") -> None:
        self.size = size
        self._fd = fd
        self._buf = memoryview(data)
        self._buf_at = 0  # file offset of _buf[0]
        self._pos = 0  # where the next sequential read starts
        self._nowait = hasattr(os, "RWF_NOWAIT")  # cleared when the filesystem refuses it
        self._error: OSError | None = None  # the last prefetch failed: read() raises it
        self._chunk = bytearray()  # fill_nowait's buffer, reused

    @classmethod
    def from_bytes(cls, data: bytes) -> Source:
        return cls(len(data), data=bytes(data))

    def read(self, offset: int, size: int) -> bytes | memoryview:
        """``size`` bytes at ``offset`` (fewer at the end); a view into the read-ahead
        buffer when buffered (the machine copies it once, into the datagram)."""
        start = offset - self._buf_at
        if start >= 0 and start + size <= len(self._buf):
            chunk = self._buf[start : start + size]
        elif self._error is not None:
            raise self._error  # the machine fails the transfer with the reason
        elif self._fd is not None:  # not buffered (a file that shrank): read here
            chunk = os.pread(self._fd, size, offset)
        else:
            chunk = self._buf[max(start, 0) : max(start, 0) + size]
        self._pos = offset + len(chunk)
        return chunk

    def short_of(self, need: int) -> bool:
        """Fewer than ``need`` bytes past the read position are buffered (and the file has more)."""
        return self._fd is not None and self._buf_at + len(self._buf) < min(
            self._pos + need, self.size
        )

    def fill_nowait(self, need: int) -> bool:
        """Buffer the next chunk if the page cache holds it; False: ``prefetch`` it."""
        if not self._nowait:
            return False
        pos = self._pos
        length = min(max(need, CHUNK), self.size - pos)
        if len(self._chunk) < length:
            self._chunk = bytearray(length)
        # Into the same buffer every time: a fresh 1 MiB is a fresh mmap, zeroed page by
        # page, for every 714 blocks. Safe because read() hands out views that its
        # caller copies before the next read.
        view = memoryview(self._chunk)[:length]
        self._buf, self._buf_at = memoryview(b""), pos  # overwritten below, even on failure
        try:
            n = os.preadv(self._fd, [view], pos, os.RWF_NOWAIT)
        except BlockingIOError:
            return False  # not cached: a worker thread waits for the disk
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                self._nowait = False  # this filesystem cannot tell: always prefetch
            return False  # any other error: prefetch meets it and keeps it for read()
        if n < min(need, self.size - pos):
            return False  # partly cached
        self._buf = view[:n]
        return True

    async def prefetch(self, need: int) -> None:
        """Buffer at least ``need`` bytes past the read position (or up to the end)."""
        if not self.short_of(need):
            return
        pos, length = self._pos, max(need, CHUNK)
        try:
            data = await trio.to_thread.run_sync(os.pread, self._fd, length, pos)
        except OSError as exc:
            self._error = exc  # read() raises it, and the transfer reports the error
            return
        self._buf, self._buf_at = memoryview(data), pos

    def close(self) -> None:
        self._buf, self._chunk = memoryview(b""), bytearray()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _streamed(fd: int, size: int) -> Source:
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except OSError:
        pass
    return Source(size, fd=fd)


def _open_confined(root: Path, requested: str) -> Source:
    handle, size = open_confined(root, requested)
    fd = os.dup(handle.fileno())
    handle.close()
    return _streamed(fd, size)


def _open_trusted(path: os.PathLike[str], requested: str) -> Source:
    denied = Refused(ErrorCode.ACCESS_VIOLATION, f"{requested}: access violation")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise Refused(ErrorCode.FILE_NOT_FOUND, f"{requested}: file not found") from None
    except OSError:
        raise denied from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise denied
    return _streamed(fd, st.st_size)


async def open_root(root: Path, requested: str) -> Source:
    """The confined file ``requested`` names under ``root`` (:class:`Refused` otherwise)."""
    return await trio.to_thread.run_sync(_open_confined, root, requested)


async def open_path(path: os.PathLike[str], requested: str) -> Source:
    """A file a plugin returned from ``tftp_open``: trusted, opened as given; errors
    quote only ``requested``."""
    return await trio.to_thread.run_sync(_open_trusted, path, requested)
