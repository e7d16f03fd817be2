"""A durable append-only journal of records, with group commit.

On disk: consecutive frames ``[u32 length][u32 crc32(payload)][payload]``.
Appends are written in order and fsynced before anyone is told they are
durable, so after a crash at any instant the file is a run of good frames
possibly followed by one torn frame; opening it keeps the good run and cuts
the rest. Compaction writes the live records to a new file, fsyncs it and
renames it over the old one (then fsyncs the directory), so a crash during
compaction leaves either the old journal or the new one, never a mix.

:class:`GroupCommitter` batches appends from many tasks into one write and
one fsync (run in a worker thread), which is what lets a DHCP server ACK
thousands of leases a second with every one durable before its ACK leaves.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import trio

from appliance.logs import get_logger

FRAME = struct.Struct("<II")
DEFAULT_MAX_RECORD = 1 << 20

log = get_logger("journal")


def frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def unframe_untrusted(
    data: bytes | memoryview, max_record: int = DEFAULT_MAX_RECORD
) -> tuple[list[bytes], int]:
    """Split ``data`` into payloads; returns them and the offset past the last good frame.

    A frame longer than ``max_record``, running past the end, or failing its
    CRC ends the scan: it and everything after it are a torn tail.
    """
    view = memoryview(data)
    payloads: list[bytes] = []
    offset = 0
    while offset + FRAME.size <= len(view):
        length, crc = FRAME.unpack_from(view, offset)
        start = offset + FRAME.size
        if length > max_record or start + length > len(view):
            break
        payload = bytes(view[start : start + length])
        if zlib.crc32(payload) != crc:
            break
        payloads.append(payload)
        offset = start + length
    return payloads, offset


class JournalFile:
    """One journal file. Blocking I/O: call from a worker thread in trio code."""

    def __init__(self, path: str | os.PathLike, max_record: int = DEFAULT_MAX_RECORD) -> None:
        self.path = Path(path)
        self.max_record = max_record
        self._fd: int | None = None
        self.records = 0  # frames in the file (live or superseded), for compaction decisions
        self.size = 0

    def open(self) -> list[bytes]:
        """Open (creating it 0600) and return every intact payload; a torn tail is cut off."""
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            if created:  # the new name itself must survive a crash
                _fsync_dir(self.path.parent)
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read()
            payloads, good = unframe_untrusted(data, self.max_record)
            if good < len(data):
                log.warning(
                    "journal had a torn or corrupt tail; cut it off",
                    path=str(self.path),
                    kept_bytes=good,
                    dropped_bytes=len(data) - good,
                )
                os.ftruncate(fd, good)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self.records, self.size = fd, len(payloads), good
        return payloads

    def append(self, frames: bytes, count: int) -> None:
        """Write ``count`` already-framed records and fsync them."""
        assert self._fd is not None, "journal is not open"
        try:
            _write_all(self._fd, frames)
            os.fdatasync(self._fd)
        except OSError:
            # A half-written frame would hide every later append behind a torn
            # frame at the next open: cut it off before anyone appends again.
            os.ftruncate(self._fd, self.size)
            raise
        self.records += count
        self.size += len(frames)

    def rewrite(self, payloads: Iterable[bytes]) -> None:
        """Replace the file's content with ``payloads`` atomically (compaction)."""
        tmp = self.path.with_name(self.path.name + ".compact")
        count, data = 0, bytearray()
        for payload in payloads:
            data += frame(payload)
            count += 1
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)
        self.close()
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        self.records, self.size = count, len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GroupCommitter:
    """Batches appends: everything submitted while one fsync runs goes in the next.

    ``submit(payload, on_durable)`` never blocks: the payload joins the
    pending batch and ``on_durable()`` runs in the trio thread once the batch
    is on disk. ``run`` is a service task; cancelling it finishes nothing
    pending (those callbacks never run, so nothing unacknowledged is claimed).
    """

    def __init__(self, journal: JournalFile) -> None:
        self.journal = journal
        self._pending = bytearray()
        self._pending_count = 0
        self._callbacks: list[Callable[[], object]] = []
        self._wakeup = trio.Event()
        self._snapshot: Callable[[], Iterable[bytes]] | None = None
        self.batches = 0
        self.failures = 0
        self.rewrites = 0

    def submit(self, payload: bytes, on_durable: Callable[[], object] | None = None) -> None:
        self._pending += frame(payload)
        self._pending_count += 1
        if on_durable is not None:
            self._callbacks.append(on_durable)
        self._wakeup.set()

    def request_rewrite(self, snapshot: Callable[[], Iterable[bytes]]) -> None:
        """Compact the journal to ``snapshot()`` before the next batch is written.

        ``snapshot`` runs in the trio thread when the rewrite starts, so it sees
        every change submitted so far; those still pending are appended after
        it (replaying a record twice changes nothing).
        """
        self._snapshot = snapshot
        self._wakeup.set()

    @property
    def pending(self) -> int:
        return self._pending_count

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            await self.flush()

    async def flush(self) -> None:
        """Write what is pending now and run its callbacks."""
        if self._snapshot is not None:
            payloads, self._snapshot = list(self._snapshot()), None
            try:
                await trio.to_thread.run_sync(self.journal.rewrite, payloads)
                self.rewrites += 1
            except OSError as exc:  # the old file is intact: keep appending to it
                log.error("journal compaction failed", path=str(self.journal.path), error=str(exc))
        while self._pending_count:
            data, count, callbacks = bytes(self._pending), self._pending_count, self._callbacks
            self._pending, self._pending_count, self._callbacks = bytearray(), 0, []
            try:
                await trio.to_thread.run_sync(self.journal.append, data, count)
            except OSError as exc:
                # Nothing in this batch is acknowledged; its senders retry.
                self.failures += 1
                log.error("journal write failed", path=str(self.journal.path), error=str(exc))
                return
            self.batches += 1
            for callback in callbacks:
                callback()
