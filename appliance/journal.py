"""A durable append-only journal of records, with group commit.

On disk: consecutive non-empty frames ``[u32 length][u32 crc32(payload)][payload]``
(:mod:`appliance.frames`). Appends are written in order and fsynced before
anyone is told they are durable, so after a crash at any instant the file is a
run of good frames possibly followed by one torn frame; opening it keeps the
good run and cuts the rest, with a warning only (damage to the last frame
alone looks the same and is treated the same).

A bad frame *followed by a good one* is not a crash but damage (a bad sector,
a bit flip, a stray write): opening keeps a copy of the file aside
(``<name>.damaged-<UTC time>``, never overwritten), recovers every good frame
before and after the damage, rewrites the journal with them, logs an error and
reports it in :attr:`JournalFile.damage` (shown by ``rackboot status``) at
every start while that copy exists. How the scan resynchronises, and how
unlikely a wrong resync is: :mod:`appliance.frames`.

Compaction writes the live records to a new file, fsyncs it and renames it
over the old one, then fsyncs the directory, so a crash during compaction
leaves either the old journal or the new one, never a mix. Until that directory
fsync has succeeded no later append is acknowledged.

:class:`GroupCommitter` batches appends from many tasks into one write and
one fsync (run in a worker thread), which is what lets a DHCP server ACK
thousands of leases a second with every one durable before its ACK leaves.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import trio

from appliance.durable import fsync_directory
from appliance.frames import DEFAULT_MAX_RECORD as DEFAULT_MAX_RECORD
from appliance.frames import FRAME as FRAME
from appliance.frames import Scan, frame, scan_untrusted
from appliance.frames import unframe_untrusted as unframe_untrusted
from appliance.logs import get_logger

DAMAGED = ".damaged-"  # infix of the copies kept of damaged journals
_MAX_COPIES_PER_SECOND = 100

log = get_logger("journal")


class CompactionError(OSError):
    """A rewrite failed at ``step``; ``replaced`` says whether the new file had
    already been renamed over the old one (it is then the journal, appended to)."""

    def __init__(self, step: str, replaced: bool, cause: OSError) -> None:
        super().__init__(cause.errno, f"{step}: {cause.strerror or cause}")
        self.step, self.replaced = step, replaced


class JournalFile:
    """One journal file. Blocking I/O: call from a worker thread in trio code."""

    def __init__(self, path: str | os.PathLike, max_record: int = DEFAULT_MAX_RECORD) -> None:
        self.path = Path(path)
        self.max_record = max_record
        self._fd: int | None = None
        self._dir_unsynced = False  # a rename not yet made durable: no append is acknowledged
        self.records = 0  # frames in the file (live or superseded), for compaction decisions
        self.size = 0
        self.damage: list[dict[str, Any]] = []  # one report per damaged copy kept aside
        self.damaged_now = False  # this open found damage in the middle (not only old copies)

    def open(self) -> list[bytes]:
        """Open (creating it 0600) and return every good payload: a torn tail is
        cut off, damage in the middle is set aside and recovered around (see above)."""
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            if created:  # the new name itself must survive a crash
                fsync_directory(self.path.parent)
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read()
            scan = scan_untrusted(data, self.max_record)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self.records, self.size = fd, len(scan.payloads), len(data)
        try:
            self.damage = self._earlier_damage()
            self.damaged_now = bool(scan.skipped)
            if scan.skipped:
                self.damage.append(self._recover(data, scan))
            elif scan.end < len(data):
                log.warning(
                    "journal had a torn tail (an append cut by a crash); cut it off",
                    path=str(self.path),
                    kept_bytes=scan.end,
                    dropped_bytes=len(data) - scan.end,
                )
                self._truncate(scan.end)
        except BaseException:
            self.close()
            raise
        return scan.payloads

    def append(self, frames: bytes, count: int) -> None:
        """Write ``count`` already-framed records and fsync them."""
        assert self._fd is not None, "journal is not open"
        self._sync_dir()
        try:
            _write_all(self._fd, frames)
            os.fdatasync(self._fd)
        except OSError:
            # A half-written frame would read as damage at the next open: cut
            # it off before anyone appends again.
            os.ftruncate(self._fd, self.size)
            raise
        self.records += count
        self.size += len(frames)

    def rewrite(self, payloads: Iterable[bytes]) -> None:
        """Replace the file's content with ``payloads`` atomically (compaction).

        Raises :class:`CompactionError`: before the rename the old file is intact
        and still the journal; after it the new file is, and only the directory
        fsync failed, which every later append retries before it succeeds.
        """
        assert self._fd is not None, "journal is not open"
        tmp = self.path.with_name(self.path.name + ".compact")
        count, data = 0, bytearray()
        for payload in payloads:
            data += frame(payload)
            count += 1
        step = "create " + tmp.name
        try:
            # Opened for appending: after the rename this descriptor is the journal,
            # so no reopen (which could fail) is needed.
            fd = os.open(
                tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600
            )
            try:
                step = "write " + tmp.name
                _write_all(fd, data)
                step = "fsync " + tmp.name
                os.fsync(fd)
                step = f"rename {tmp.name} over {self.path.name}"
                os.replace(tmp, self.path)
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            _unlink_quietly(tmp)
            raise CompactionError(step, False, exc) from exc
        old, self._fd = self._fd, fd
        self.records, self.size, self._dir_unsynced = count, len(data), True
        _close_quietly(old)
        try:
            self._sync_dir()
        except OSError as exc:
            raise CompactionError("fsync the directory", True, exc) from exc

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _sync_dir(self) -> None:
        if self._dir_unsynced:
            fsync_directory(self.path.parent)
            self._dir_unsynced = False

    def _truncate(self, size: int) -> None:
        assert self._fd is not None
        os.ftruncate(self._fd, size)
        os.fsync(self._fd)
        self.size = size

    def _recover(self, data: bytes, scan: Scan) -> dict[str, Any]:
        """Damage in the middle: keep a copy, rewrite the journal with what was recovered."""
        when, copy = time.time(), None
        try:
            copy = _keep_copy(self.path, data, when)
            self.rewrite(scan.payloads)
        except CompactionError as exc:
            if not exc.replaced:
                self._cannot_rewrite(scan, exc)
            else:  # the recovered file is the journal; appends wait for the directory
                log.error(
                    "recovered journal renamed, but the directory fsync failed: no append is "
                    "acknowledged until a retry of that fsync succeeds",
                    path=str(self.path),
                    error=str(exc),
                )
        except OSError as exc:
            self._cannot_rewrite(scan, exc)
        report = _report(self.path, when, scan, copy)
        log.error(
            "journal damaged in the middle: kept a copy and recovered the records around the damage",
            **report,
        )
        return report

    def _cannot_rewrite(self, scan: Scan, exc: OSError) -> None:
        log.error(
            "could not copy the damaged journal aside or rewrite it: it is left as it is "
            "(appended to after its last good record) and recovered again at the next start",
            path=str(self.path),
            error=str(exc),
        )
        self._truncate(scan.end)

    def _earlier_damage(self) -> list[dict[str, Any]]:
        """Reports for the copies earlier starts kept: shown until the operator removes them."""
        prefix = self.path.name + DAMAGED
        reports = []
        for copy in sorted(self.path.parent.iterdir()):
            if not copy.name.startswith(prefix):
                continue
            try:
                when, data = copy.stat().st_mtime, copy.read_bytes()
            except OSError as exc:
                log.warning("cannot read a damaged journal copy", copy=str(copy), error=str(exc))
                continue
            reports.append(_report(self.path, when, scan_untrusted(data, self.max_record), copy))
            log.warning(
                "a damaged copy of the journal is kept from an earlier start: examine it, "
                "then remove it to clear this report",
                **reports[-1],
            )
        return reports


def _report(path: Path, when: float, scan: Scan, copy: Path | None) -> dict[str, Any]:
    return {
        "file": str(path),
        "when": _utc(when, "%Y-%m-%dT%H:%M:%SZ"),
        "damaged_at": [[offset, length] for offset, length in scan.skipped],
        "bytes_lost": scan.bytes_lost,
        "records_kept": len(scan.payloads),
        "records_recovered": scan.recovered,
        "copy": None if copy is None else str(copy),
    }


def _utc(when: float, fmt: str) -> str:
    return time.strftime(fmt, time.gmtime(when))


def _keep_copy(path: Path, data: bytes, when: float) -> Path:
    """Write ``data`` to a new ``<name>.damaged-<time>[-n]`` next to ``path``, fsynced."""
    stamp = path.name + DAMAGED + _utc(when, "%Y%m%dT%H%M%SZ")
    for n in range(_MAX_COPIES_PER_SECOND):
        copy = path.with_name(f"{stamp}-{n}" if n else stamp)
        try:
            fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_directory(path.parent)
        except OSError:
            _unlink_quietly(copy)
            raise
        return copy
    raise FileExistsError(f"{stamp}: {_MAX_COPIES_PER_SECOND} copies already")


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]



def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # a leftover is overwritten (compaction) or reported (a damaged copy)


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass  # Linux frees the descriptor anyway; what it held was fsynced


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
        self.compaction_failures = 0

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
            except CompactionError as exc:
                self.rewrites += exc.replaced  # compacted all the same
                self.compaction_failures += 1
                self._compaction_failed(exc)
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

    def _compaction_failed(self, exc: CompactionError) -> None:
        fields = {"path": str(self.journal.path), "step": exc.step, "error": str(exc.__cause__)}
        if exc.replaced:
            log.error(
                "journal compacted, but the rename may not survive a crash (the directory fsync "
                "failed): no append is acknowledged until a retry of that fsync succeeds",
                **fields,
            )
        else:
            log.error(
                "journal compaction failed before the rename: the old file is intact and "
                "still appended to",
                **fields,
            )

    def status(self) -> dict[str, Any]:
        """The journal's part of ``rackboot status``."""
        return {
            "records": self.journal.records,
            "batches": self.batches,
            "failures": self.failures,
            "rewrites": self.rewrites,
            "compaction_failures": self.compaction_failures,
            "damage": self.journal.damage,
        }
