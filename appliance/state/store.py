"""One node's state (trio shell): the log's writer, the committed tables, the changefeed.

Plugins keep what must survive a restart or a failover here, in namespaces
of keys and values (docs/plugins.md, "State"):

* ``put(ns, key, value)`` (``None`` deletes) appends a record stamped with the
  rack lease's epoch and the next LSN; only the node that holds the lease
  may (:class:`NotWriter` otherwise: the fence is asked at the moment of
  the append). It returns once the record is **committed**: durable here
  (group commit: one write and one fdatasync for everything appended
  meanwhile) and acknowledged as the commit policy asks (:attr:`policy`;
  a standalone node needs nothing more);
* tables change only when a record commits, in LSN order (``get``, ``scan``);
* ``subscribe(ns, after)`` yields every committed change of ``ns`` after a
  position, in order, from memory or, when the log was compacted past it, a
  :class:`Reset` with the namespace's whole content, then the changes after.

The writer is one task: records are written in LSN order, and a write that
fails is retried (nothing later is written before it), so the log never has
a hole. Compaction rewrites the file as a snapshot of the committed tables
plus the records not yet committed, atomically.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from appliance.errors import RackbootError
from appliance.journal import CompactionError, frame
from appliance.logs import get_logger
from appliance.state.log import Recovery, StateLog, Worker, snapshot_payloads
from appliance.state.records import (
    BadEntry,
    EpochHistory,
    Record,
    SnapshotEntry,
    SnapshotHead,
    decode_untrusted,
    encode,
)
from appliance.state.tables import Tables

log = get_logger("state")

COMPACT_MIN_RECORDS = 4096  # below this the log is never compacted
COMPACT_RATIO = 4  # compact when the log holds this many records per live key
RETRY_WRITE = 1.0  # s between attempts at a write that failed


Callback = Callable[["Position | None"], object]


class NotWriter(RackbootError):
    """Only the holder of the rack's lease writes state."""


class Fence(Protocol):
    epoch: int

    def ok(self) -> bool: ...


class CommitPolicy(Protocol):
    def committable(self, durable: int) -> int:
        """The highest LSN that may commit, given that ``durable`` is durable here."""
        ...


class LocalCommit:
    """A node alone: durable here is committed."""

    def committable(self, durable: int) -> int:
        return durable


@dataclass(frozen=True)
class Position:
    """Where a reader of the changefeed is: after record ``lsn`` of ``epoch``."""

    epoch: int = 0
    lsn: int = 0


@dataclass(frozen=True)
class Change:
    position: Position
    key: str
    value: Any  # None: deleted


@dataclass(frozen=True)
class Reset:
    """The whole namespace at ``position``: what a reader starts over from when the
    changes after its position are no longer kept, or never were on this log."""

    position: Position
    items: dict[str, Any]


class StateStore:
    def __init__(self, directory: Path, fence: Fence, policy: CommitPolicy | None = None, *,
                 log: Any = None, blocking: Any = None) -> None:  # fmt: skip
        """``log``: the file (a :class:`StateLog` under ``directory`` unless given: the
        simulation keeps one in memory); ``blocking``: how its blocking calls run (the
        log's own worker thread unless given)."""
        self.log = log if log is not None else StateLog(Path(directory) / "log")
        self._worker: Worker | None = None
        if blocking is None:
            blocking = self._worker = Worker()
        self._blocking = blocking
        self.fence = fence
        self.policy: CommitPolicy = policy or LocalCommit()
        self.tables = Tables()
        self.base = 0  # the snapshot at the start of the log file
        self.base_epoch = 0  # the epoch of that snapshot's last record
        self.tail: list[Record] = []  # committed records after ``base``, in LSN order
        # Records not committed yet: (record, callback, appended here as the leader). A
        # leader's callback gets the position once the record commits under its lease, or
        # None if the lease was lost first; a follower's once the record is on its disk.
        self.uncommitted: deque[tuple[Record, Callback | None, bool]] = deque()
        self.recovery: Recovery | None = None
        # A damaged log (a hole in the middle): as a follower it is dropped and sent again
        # whole by the leader (prepare_to_follow), so nothing missing stays missing.
        self.resync_needed = False
        self.next_lsn = 1
        self.durable = 0  # the last LSN on disk
        self._unwritten = bytearray()  # frames of records not yet written, in LSN order
        self._unwritten_last = 0
        self._compact = False
        self._wakeup = trio.Event()
        self._committed = trio.Event()  # set and replaced on every commit
        # Namespace -> set (and dropped) when a record of it commits: a changefeed wakes for
        # its own namespace only, not for every group commit of another one.
        self._changed: dict[str, trio.Event] = {}
        self.on_append: list[Callable[[], object]] = []  # replication's send loops
        self.counters = {"writes": 0, "write_failures": 0, "compactions": 0,
                         "compaction_failures": 0, "callback_failures": 0}  # fmt: skip

    # -- start-up --------------------------------------------------------------------

    def load(self) -> Recovery:
        """Read the log (blocking). A break in it is reported, and what follows is applied
        as well: the later records are the best this node has (see appliance/state/log.py)."""
        if isinstance(self.log, StateLog):
            self.log.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        recovery = self.log.open()
        self.tables, self.base, self.tail = recovery.tables, recovery.base, list(recovery.tail)
        self.base_epoch = recovery.base_epoch
        if recovery.problem:
            log.error("the state log is damaged: records may be missing", path=str(self.log.path),
                      problem=recovery.problem, beyond=len(recovery.beyond))  # fmt: skip
            for record in recovery.beyond:
                self._skip_to(record)
            # The changes across the hole cannot be told: readers start over from here, and
            # the file is rewritten without the hole.
            self.base, self.tail, self._compact = self.tables.lsn, [], True
            self.base_epoch = self.tables.epoch
        if recovery.repair:
            self.log.set_resync(True)
        self.resync_needed = self.log.wants_resync()
        self.recovery = recovery
        self.durable = self.tables.lsn
        self.next_lsn = self.durable + 1
        log.info("state loaded", path=str(self.log.path), lsn=self.tables.lsn,
                 epoch=self.tables.epoch, keys=self.tables.count())  # fmt: skip
        return recovery

    def _skip_to(self, record: Record) -> None:
        """Apply a record past a hole (a damaged log on a node alone)."""
        if record.lsn <= self.tables.lsn or record.epoch < self.tables.epoch:
            return
        self.tables.lsn = record.lsn - 1
        self.tables.apply(record)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The writer: one write + fdatasync for whatever was appended meanwhile."""
        task_status.started()
        self._wakeup.set()  # a compaction asked for at load
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                if self._compact:
                    await self._compaction()
                if self._unwritten:
                    await self._write()
        finally:
            self.log.close()
            if self._worker is not None:
                self._worker.close()

    async def _write(self) -> None:
        data, last = bytes(self._unwritten), self._unwritten_last
        count = last - self.durable
        try:
            await self._blocking(self.log.journal.append, data, count)
        except OSError as exc:
            self.counters["write_failures"] += 1
            log.error("state write failed; retrying", error=str(exc), records=count)
            await trio.sleep(RETRY_WRITE)
            self._wakeup.set()
            return
        del self._unwritten[: len(data)]
        self.counters["writes"] += 1
        self.durable = last
        self.advance()

    async def _compaction(self) -> None:
        self._compact = False
        # Records appended but not written stay in _unwritten and follow the new file.
        written = [r for r, _, _ in self.uncommitted if r.lsn <= self.durable]
        payloads = snapshot_payloads(self.tables, written)
        try:
            await self._blocking(self.log.journal.rewrite, payloads)
        except CompactionError as exc:
            self.counters["compaction_failures"] += 1
            log.error("state compaction failed", step=exc.step, replaced=exc.replaced,
                      error=str(exc.__cause__))  # fmt: skip
            if not exc.replaced:
                return
        self.counters["compactions"] += 1
        self.base, self.base_epoch, self.tail = self.tables.lsn, self.tables.epoch, []

    # -- writing (the holder of the lease) -------------------------------------------

    def append(self, ns: str, key: str, value: Any,
               on_commit: Callback | None = None) -> Record:  # fmt: skip
        """Append one record now; ``on_commit(position)`` runs once it commits, or
        ``on_commit(None)`` if this node loses the lease before it does."""
        if not self.fence.ok():
            raise NotWriter("this node does not hold the rack's lease: it cannot write state")
        epoch = self.fence.epoch
        if epoch < self.tables.epoch or (
            self.uncommitted and epoch < self.uncommitted[-1][0].epoch
        ):
            raise NotWriter(f"epoch {epoch} is older than the log's")
        record = Record(epoch, self.next_lsn, ns, key, value)
        data = encode(record)  # ValueError when too large: nothing changed
        try:  # what a restart or a standby will read back: refused now, not found damaged then
            decode_untrusted(data)
        except BadEntry as exc:
            raise ValueError(f"state record {ns[:64]!r}/{key[:64]!r}: {exc}") from None
        self._unwritten += frame(data)
        self.next_lsn += 1
        self._unwritten_last = record.lsn
        self.uncommitted.append((record, on_commit, True))
        self._wakeup.set()
        for wake in self.on_append:
            wake()
        if len(self.tail) + len(self.uncommitted) > max(
            COMPACT_MIN_RECORDS, COMPACT_RATIO * self.tables.count()
        ):
            self._compact = True
        return record

    async def put(self, ns: str, key: str, value: Any) -> Position:
        """Append and wait until committed."""
        done: list[Position | None] = []
        event = trio.Event()

        def committed(position: Position | None) -> None:
            done.append(position)
            event.set()

        self.append(ns, key, value, committed)
        await event.wait()
        if done[0] is None:
            raise NotWriter("this node lost the rack's lease before the record committed")
        return done[0]

    def advance(self) -> None:
        """Commit what the policy allows now (after a write, or an acknowledgement). A node
        that does not hold the lease commits what is on its disk: a follower's records came
        from its leader; what it appended itself as a deposed leader is kept (its callbacks
        told None), and cut later if the new leader lacks it."""
        leading = self.fence.ok()
        limit = self.policy.committable(self.durable) if leading else self.durable
        uncommitted, changed = self.uncommitted, self._changed
        committed = False
        while uncommitted and uncommitted[0][0].lsn <= limit:
            record, callback, ours = uncommitted.popleft()
            self.tables.apply(record)
            self.tail.append(record)
            committed = True
            if record.ns in changed:
                changed.pop(record.ns).set()
            if callback is not None:
                try:  # a plugin's bug must not stop the state service (and the node)
                    callback(Position(record.epoch, record.lsn) if leading or not ours else None)
                except Exception as exc:
                    self.counters["callback_failures"] += 1
                    log.error("a state commit callback failed", ns=record.ns, lsn=record.lsn,
                              error=f"{type(exc).__name__}: {exc}")  # fmt: skip
        if committed:
            self._committed.set()
            self._committed = trio.Event()

    # -- replication: what a leader's streams read (replication.Source) --------------

    def last(self) -> int:
        return self.next_lsn - 1

    def records(self, after: int, limit: int) -> list[Record]:
        out = self.tail[max(0, after - self.base) : max(0, after - self.base) + limit]
        if len(out) < limit:
            skip = max(0, after - self.tables.lsn)
            out.extend(r for n, (r, _, _) in enumerate(self.uncommitted)
                       if skip <= n < skip + limit - len(out))  # fmt: skip
        return out

    def snapshot(self) -> tuple[SnapshotHead, list[SnapshotEntry]]:
        return self.tables.snapshot()

    def end_of(self, epoch: int) -> tuple[int, int]:
        history = EpochHistory(self.tables.history.entries)
        for record, _, _ in self.uncommitted:
            history.note(record.epoch, record.lsn)
        newest = max((e for e, _ in history.entries if e <= epoch), default=epoch)
        end = history.end_of(epoch, self.last())
        return newest, -1 if end is None or self.base > 0 and end < self.base else end

    def epoch_at(self, lsn: int) -> int | None:
        if lsn == self.base:
            return self.base_epoch
        if self.base < lsn <= self.tables.lsn:
            return self.tail[lsn - self.base - 1].epoch
        n = lsn - self.tables.lsn - 1
        return self.uncommitted[n][0].epoch if 0 <= n < len(self.uncommitted) else None

    # -- replication: a follower's side ----------------------------------------------

    def append_replicated(self, records: list[Record], on_durable: Callable[[int], object]) -> None:
        """Records from the leader, already checked to continue this log; they commit here
        once durable (a follower commits what its leader sent), then ``on_durable(lsn)``."""
        for record in records:
            self._unwritten += frame(encode(record))
            self.uncommitted.append((record, None, False))
        last = records[-1]
        self._unwritten_last, self.next_lsn = last.lsn, last.lsn + 1
        self.uncommitted[-1] = (last, lambda _position: on_durable(last.lsn), False)
        self._wakeup.set()

    async def prepare_to_follow(self) -> None:
        """Before a follower's hello: what this node appended as a leader is written and
        commits here (its position must not move after the hello: a record it wrote later
        would be applied before the leader's of the same LSN), and a damaged log is dropped
        (the leader then sends a snapshot and the records after it)."""
        self.advance()
        await self._settled()
        if self.resync_needed:
            await self.cut_after(0)
            await self._blocking(self.log.set_resync, False)
            self.resync_needed = False
            log.warning("the damaged state log was dropped: the leader sends it again")

    async def cut_after(self, lsn: int) -> None:
        """Drop every record after ``lsn`` (a divergent tail): the tables and the file
        are rebuilt from what the file holds up to it (nothing, if ``lsn`` is before
        its snapshot: the leader then sends one)."""
        await self._settled()
        tables = await self._blocking(self.log.tables_upto, lsn)
        await self._replace(tables)
        log.warning("cut the log's divergent tail", after=lsn, kept=tables.lsn)

    async def install(self, head: SnapshotHead, entries: list[SnapshotEntry]) -> None:
        """Replace everything with the leader's snapshot."""
        await self._settled()
        tables = Tables()
        tables.restore(head, entries)
        await self._replace(tables)
        log.info("installed the leader's snapshot", lsn=head.lsn, keys=len(entries))

    async def _settled(self) -> None:
        """Wait until what was appended is on disk and committed (a follower's)."""
        while self._unwritten or self.uncommitted:
            await self._committed.wait()

    async def _replace(self, tables: Tables) -> None:
        await self._blocking(self.log.journal.rewrite, snapshot_payloads(tables, []))
        self.tables, self.tail = tables, []
        self.base, self.base_epoch = tables.lsn, tables.epoch
        self.durable, self.next_lsn = tables.lsn, tables.lsn + 1
        self._committed.set()
        self._committed = trio.Event()
        for event in self._changed.values():  # every namespace starts over (a Reset)
            event.set()
        self._changed.clear()

    # -- reading ---------------------------------------------------------------------

    def get(self, ns: str, key: str, default: Any = None) -> Any:
        return self.tables.get(ns, key, default)

    def scan(self, ns: str, prefix: str = ""):
        return self.tables.scan(ns, prefix)

    @property
    def position(self) -> Position:
        return Position(self.tables.epoch, self.tables.lsn)

    async def subscribe(
        self, ns: str, after: Position = Position()
    ) -> AsyncGenerator[Change | Reset, None]:
        """Every committed change of ``ns`` after ``after``, in order, for as long as the
        caller iterates; a :class:`Reset` first when the changes after ``after`` cannot be
        told (compacted away, or ``after`` is not a position of this log's history)."""
        position = after
        while True:
            while position.lsn < self.tables.lsn or not self._continues(position):
                if not self._continues(position):
                    position = self.position
                    yield Reset(position, dict(self.tables.scan(ns)))
                    continue
                # To the next record of ``ns``, or the last one: the others need no Position.
                tail = self.tail
                n = position.lsn - self.base
                while n < len(tail) - 1 and tail[n].ns != ns:
                    n += 1
                record = tail[n]
                position = Position(record.epoch, record.lsn)
                if record.ns == ns:
                    yield Change(position, record.key, record.value)
            event = self._changed.get(ns)
            if event is None:
                event = self._changed[ns] = trio.Event()
            await event.wait()

    def _continues(self, position: Position) -> bool:
        """Can the changes after ``position`` be read from this log's memory? Only if this
        log holds that very record: the same LSN written under the same epoch (one holder
        per epoch writes each LSN once), and nothing before it was compacted away."""
        if position.lsn == 0:
            return self.base == 0
        if not self.base <= position.lsn <= self.tables.lsn:
            return False
        if position.lsn == self.base:
            return position.epoch == self.base_epoch
        return self.tail[position.lsn - self.base - 1].epoch == position.epoch

    # -- operators -------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        recovery = self.recovery
        return {
            "epoch": self.tables.epoch,
            "lsn": self.tables.lsn,
            "durable": self.durable,
            "uncommitted": len(self.uncommitted),
            "keys": self.tables.count(),
            "snapshot": self.base,
            **self.counters,
            "problem": recovery.problem if recovery else "",
            "resync_needed": self.resync_needed,
            "damage": recovery.damage if recovery else [],
        }
