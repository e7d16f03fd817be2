"""The state log on disk: one journal file of entries (appliance/journal.py does the
framing, fsync, torn tails, damage copies and atomic rewrites); this module
reads it back into tables and says what, if anything, is missing.

Reading checks what the frames alone cannot: a snapshot holds as many
entries as its head says, records follow with consecutive LSNs and epochs
that never fall. The first break ends the **contiguous** part: everything
up to it is applied; what comes after (``beyond``) is kept aside in the
:class:`Recovery`, and the node says so loudly (status, log). A node with a
leader to learn from cuts the log there and fetches the rest again (resync);
a node on its own applies ``beyond`` as well, since the later records are
the best it has (the damaged copy stays on disk for an operator).

Blocking file I/O: trio code calls these from a worker thread, by default the
log's own (:class:`Worker`).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import outcome
import trio

from appliance.frames import scan_untrusted
from appliance.journal import JournalFile
from appliance.state.records import (
    MAX_ENTRY,
    BadEntry,
    Record,
    SnapshotEntry,
    SnapshotHead,
    decode_untrusted,
    encode,
)
from appliance.state.tables import Tables


@dataclass
class Recovery:
    """What opening the log found."""

    tables: Tables
    base: int  # LSN of the snapshot at the start of the file (0: none)
    base_epoch: int  # the epoch of the snapshot's last record
    tail: list[Record]  # records after the snapshot, applied
    beyond: list[Record] = field(default_factory=list)  # records after a break, not applied
    problem: str = ""  # why the contiguous part ended before the file did
    damage: list[dict[str, Any]] = field(default_factory=list)  # the journal's reports
    repair: bool = False  # this open found a break or damage: the leader must resend it all


def read_entries(payloads: list[bytes], upto: int | None = None) -> Recovery:
    """Tables from a log's payloads, stopping at the first break, or after record
    ``upto`` (pure)."""
    tables, tail = Tables(), list[Record]()
    base, base_epoch, position = 0, 0, 0
    try:
        first = decode_untrusted(payloads[0]) if payloads else None
        if isinstance(first, SnapshotHead):
            snapshot = [decode_untrusted(p) for p in payloads[1 : 1 + first.entries]]
            if len(snapshot) < first.entries or not all(
                isinstance(e, SnapshotEntry) for e in snapshot
            ):
                raise BadEntry(f"the snapshot at LSN {first.lsn} is incomplete")
            tables.restore(first, snapshot)  # type: ignore[arg-type]
            base, base_epoch, position = first.lsn, first.epoch, 1 + first.entries
    except BadEntry as exc:
        return Recovery(tables, 0, 0, [], _records(payloads, 0), f"unreadable snapshot: {exc}")
    for n in range(position, len(payloads)):
        if upto is not None and tables.lsn >= upto:
            break
        try:
            record = decode_untrusted(payloads[n])
            if not isinstance(record, Record):
                raise BadEntry("a snapshot entry among the records")
            tables.apply(record)
        except ValueError as exc:  # BadEntry or OutOfOrder
            return Recovery(tables, base, base_epoch, tail, _records(payloads[n:], tables.lsn),
                            f"after LSN {tables.lsn}: {exc}")  # fmt: skip
        tail.append(record)
    return Recovery(tables, base, base_epoch, tail)


def _records(payloads: list[bytes], after: int) -> list[Record]:
    """The readable records among ``payloads`` past LSN ``after``, in order."""
    out: list[Record] = []
    for payload in payloads:
        try:
            entry = decode_untrusted(payload)
        except BadEntry:
            continue
        if isinstance(entry, Record) and entry.lsn > max(after, out[-1].lsn if out else 0):
            out.append(entry)
    return out


class StateLog:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.journal = JournalFile(self.path, max_record=MAX_ENTRY)

    def open(self) -> Recovery:
        recovery = read_entries(self.journal.open())
        recovery.repair = bool(recovery.problem) or self.journal.damaged_now
        recovery.damage = self.journal.damage
        if self.journal.damage and not recovery.problem:
            recovery.problem = "frames were damaged (see damage): records may be missing"
        return recovery

    def rewrite(self, tables: Tables, records: Iterable[Record]) -> None:
        """The file becomes a snapshot of ``tables`` followed by ``records``
        (compaction, or cutting a divergent tail). Raises CompactionError."""
        self.journal.rewrite(snapshot_payloads(tables, records))

    @property
    def _resync_marker(self) -> Path:
        return self.path.with_name(self.path.name + ".resync")

    def wants_resync(self) -> bool:
        """A damaged log not yet sent again by a leader (kept across restarts: once the
        file is compacted, the hole no longer shows)."""
        return self._resync_marker.exists()

    def set_resync(self, wanted: bool) -> None:
        if wanted:
            self._resync_marker.write_bytes(b"")
        else:
            self._resync_marker.unlink(missing_ok=True)
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def tables_upto(self, lsn: int) -> Tables:
        """The state after record ``lsn`` as this file holds it (empty if ``lsn`` is
        before its snapshot), read without disturbing the open journal."""
        recovery = read_entries(scan_untrusted(self.path.read_bytes(), MAX_ENTRY).payloads, lsn)
        return recovery.tables if recovery.tables.lsn == lsn else Tables()

    def close(self) -> None:
        self.journal.close()


def snapshot_payloads(tables: Tables, records: Iterable[Record]) -> list[bytes]:
    head, entries = tables.snapshot()
    return [encode(head), *map(encode, entries), *map(encode, records)]


class Worker:
    """The state log's blocking calls (a group commit's write and fdatasync, rewrites), one
    after another on one thread of its own: ``await worker(fn, *args)``.

    The writer makes one such call per group commit, and ``trio.to_thread.run_sync``
    costs about twice the CPU of this hand-over (~115 vs ~60 µs per call on one vCPU):
    it finds or starts a pooled thread and takes a capacity limiter each time. Like
    it, the call cannot be cancelled once handed over. The thread starts at the first
    call and ends at :meth:`close` (a later call starts another)."""

    def __init__(self, name: str = "state-log") -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        task, token = trio.lowlevel.current_task(), trio.lowlevel.current_trio_token()
        self._queue.put((fn, args, task, token))
        return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, args, task, token = item
            result = outcome.capture(fn, *args)
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task, result)
            except trio.RunFinishedError:  # the caller's run ended meanwhile
                pass
