"""What the plugin keeps: installer events and the token secret, on the node's state log.

Both live in ``node.state`` (appliance/state, docs/state.md), written only by the
node that holds the rack's lease and replicated to the others:

* events in :data:`~.events.EVENTS_NS`, one key per event (``<mac>/<seq>``) and one
  per cleared machine (``<mac>/cleared``); every node's :class:`MachineEvents`
  table is fed by the namespace's changefeed (a reset rebuilds it). An event is
  acknowledged once its record is committed: durable here and acknowledged by the
  standbys as the commit rule asks;
* the token secret in :data:`SECRET_NS`: created once by an active node (or imported
  from the ``secret`` file of earlier releases), read by every node from its table.

Earlier releases kept both in files of their own (``<data_dir>/httpboot/events.journal``
and ``secret``, on one appliance only): :func:`read_legacy_journal` and
:func:`read_legacy_secret` read them for the one-time import an active node makes.
"""

from __future__ import annotations

import math
import os
import secrets
import stat
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import trio

from appliance.errors import RackbootError
from appliance.journal import JournalFile
from appliance.logs import get_logger
from appliance.state.store import Change, NotWriter, Position, Reset, StateStore

from .events import (
    EVENTS_NS,
    MAX_RECORD_BYTES,
    Cleared,
    CorruptRecord,
    Event,
    MachineEvents,
    cleared_key,
    decode_record_untrusted,
    entry,
    event_key,
)

log = get_logger("httpboot.store")

SECRET_NS = "httpboot.secret"
SECRET_KEY = "events-token"
META_NS = "httpboot.meta"
IMPORT_KEY = "events-journal-import"
SECRET_BYTES = 32
MIN_SECRET_BYTES = 16
DURABLE_WAIT = 10.0  # seconds an event may wait for its commit before the installer gets 503

Announce = Callable[[Event], object]


@dataclass
class _Pending:
    """One record on its way to commit."""

    done: trio.Event = field(default_factory=trio.Event)
    position: Position | None = None
    late: Callable[[], object] | None = None  # set once the poster stopped waiting

    def committed(self, position: Position | None) -> None:
        self.position = position
        self.done.set()
        if self.late is not None and position is not None:
            self.late()


class EventStore:
    """The events of the rack's machines, in ``state`` (every node), and how the active
    node records them."""

    def __init__(self, state: StateStore, retain: int) -> None:
        self.state = state
        self.table = MachineEvents(retain)
        self.position = Position()  # of the last change the table has seen
        self.corrupt = 0  # entries of the namespace that are not events (skipped)
        self.resets = 0
        self._late_send, self._late = trio.open_memory_channel[tuple[Event, Announce]](math.inf)

    # -- the table (every node) ------------------------------------------------------

    def load(self) -> MachineEvents:
        """The table as the committed state holds it now; :meth:`follow` goes on from here."""
        self._reset(Reset(self.state.position, dict(self.state.scan(EVENTS_NS))))
        log.info("events loaded", machines=len(self.table), events=self.table.held(),
                 lsn=self.position.lsn)  # fmt: skip
        return self.table

    def _reset(self, reset: Reset) -> None:
        skipped = self.table.reset(reset.items)
        self.corrupt += skipped
        if skipped:
            log.error("skipped state entries that are not events", namespace=EVENTS_NS,
                      entries=skipped)  # fmt: skip
        self.position = reset.position

    async def follow(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Apply every committed change of the namespace after :attr:`position`; a reset
        (the changes after it can no longer be told) rebuilds the table."""
        task_status.started()
        feed = cast(
            AsyncGenerator[Change | Reset, None], self.state.subscribe(EVENTS_NS, self.position)
        )
        async with aclosing(feed) as changes:
            async for change in changes:
                if isinstance(change, Reset):
                    self.resets += 1
                    log.info("events table rebuilt from the state", lsn=change.position.lsn)
                    self._reset(change)
                    continue
                self.position = change.position
                try:
                    self.table.change(change.key, change.value)
                except CorruptRecord as exc:
                    self.corrupt += 1
                    log.error("skipped a state entry that is not an event", error=str(exc))

    async def announce_late(self) -> None:
        """Events that committed after their poster gave up waiting are announced here."""
        async for event, announce in self._late:
            announce(event)

    # -- recording (the holder of the lease) -----------------------------------------

    def _floor(self, mac: str) -> int:
        """The highest sequence number of ``mac`` the committed state holds, though the
        table may not show it yet (its changefeed runs a little behind commits): a key is
        never written twice."""
        cleared = self.state.get(EVENTS_NS, cleared_key(mac))
        seq = max(
            self.table.last_seq(mac), cleared.get("seq", 0) if isinstance(cleared, dict) else 0
        )
        while self.state.get(EVENTS_NS, event_key(mac, seq + 1)) is not None:
            seq += 1
        return seq

    def next_event(
        self, mac: str, stage: str, status: str, message: str, now: float, client: str
    ) -> Event:
        return self.table.next_event(mac, stage, status, message, now, client, self._floor(mac))

    async def _put(
        self, record: Event | Cleared, late: Callable[[], object] | None = None
    ) -> str | None:
        """Append ``record`` and wait for its commit: None once committed, else why not:
        ``fenced`` (this node may not write, or lost the lease before the commit) or
        ``not-durable`` (not committed within DURABLE_WAIT; ``late()`` runs if it does later)."""
        pending = _Pending()
        key, value = entry(record)
        try:
            self.state.append(EVENTS_NS, key, value, pending.committed)
        except NotWriter:
            return "fenced"
        with trio.move_on_after(DURABLE_WAIT):
            await pending.done.wait()
        if not pending.done.is_set():
            pending.late = late
            return "not-durable"
        return None if pending.position is not None else "fenced"

    async def record(self, event: Event, announce: Announce) -> str | None:
        """Record ``event``: None once its record committed (``announce(event)`` called
        first, once), else why not (see :meth:`_put`). The machine's events past its last
        ``retain`` are deleted after it."""
        refusal = await self._put(event, lambda: self._late_send.send_nowait((event, announce)))
        if refusal is None:
            announce(event)
            self._delete(
                event.mac, self.table.stale(event.mac, event.seq) + [event.seq - self.table.retain]
            )
        return refusal

    async def clear(self, mac: str) -> tuple[int, str | None]:
        """Forget ``mac``'s events (its sequence goes on): how many were shown, and None
        once the cleared marker committed, else why not."""
        forgotten = len(self.table.events(mac))
        cleared = self.table.clearing(mac, self._floor(mac))
        refusal = await self._put(cleared)
        if refusal is None:
            shown = self.table.last_seq(mac)  # and those committed that it does not show yet
            held = [seq for seq in self.table.held_seqs(mac) if seq <= cleared.seq]
            self._delete(mac, held + list(range(shown + 1, cleared.seq + 1)))
        return forgotten, refusal

    def _delete(self, mac: str, seqs: list[int]) -> None:
        """Delete records for the events of ``seqs`` the committed state still holds; not
        waited for (one the lease's loss leaves is deleted with the machine's next event)."""
        for seq in sorted(set(seqs)):
            key = event_key(mac, seq)
            if seq > 0 and self.state.get(EVENTS_NS, key) is not None:
                try:
                    self.state.append(EVENTS_NS, key, None)
                except NotWriter:
                    return

    def status(self) -> dict[str, Any]:
        return {"namespace": EVENTS_NS, "events": self.table.held(), "lsn": self.position.lsn,
                "resets": self.resets, "corrupt": self.corrupt}  # fmt: skip


# -- the token secret ----------------------------------------------------------------


class Secret:
    """The rack's token secret as this node's committed state holds it (None: not yet)."""

    def __init__(self, state: StateStore) -> None:
        self.state = state
        self._seen: Any = None
        self._value: bytes | None = None

    def __call__(self) -> bytes | None:
        held = self.state.get(SECRET_NS, SECRET_KEY)
        if held is not self._seen:
            self._seen, self._value = held, _secret_of(held)
        return self._value

    async def ensure(self, legacy: bytes | None, node_name: str) -> bool:
        """On the active node: write the secret if the state has none, the ``legacy`` one
        (an earlier release's file) if given, else 32 random bytes. True if it wrote it.
        :class:`NotWriter` if this node may not write."""
        if self.state.get(SECRET_NS, SECRET_KEY) is not None:
            return False
        origin = "imported" if legacy is not None else "created"
        value = legacy if legacy is not None else secrets.token_bytes(SECRET_BYTES)
        await self.state.put(SECRET_NS, SECRET_KEY, {"secret": value.hex(), "origin": origin,
                                                     "node": node_name, "time": time.time()})  # fmt: skip
        log.info(f"{origin} the rack's events token secret in the state log", node=node_name)
        return True


def _secret_of(held: Any) -> bytes | None:
    try:
        value = bytes.fromhex(held["secret"])
    except (TypeError, KeyError, ValueError):
        if held is not None:
            log.error("the events token secret in the state is malformed", namespace=SECRET_NS)
        return None
    return value if len(value) >= MIN_SECRET_BYTES else None


def read_legacy_secret(path: Path) -> bytes | None:
    """The secret file of earlier releases, if there is one (never created now). Blocking.

    A secret others may read would let them forge every machine's token: such
    a file is refused, not silently used.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise RackbootError(
                f"{path}: the events token secret must be a regular file of mode 0600 "
                f"(found {stat.filemode(st.st_mode)})"
            )
        secret = os.read(fd, 4096)
    finally:
        os.close(fd)
    if len(secret) < MIN_SECRET_BYTES:
        raise RackbootError(f"{path}: the events token secret must hold at least 16 bytes")
    return secret


# -- the old events journal ----------------------------------------------------------


@dataclass
class LegacyJournal:
    """What an earlier release's events journal held (replayed, retention applied)."""

    table: MachineEvents
    records: int
    corrupt: int
    damage: list[dict[str, Any]]


def read_legacy_journal(path: Path, retain: int) -> LegacyJournal | None:
    """Replay the events journal of earlier releases, if there is one (a torn tail is
    cut, damage recovered around and kept aside, as they did). Blocking."""
    if not path.exists():
        return None
    journal = JournalFile(path, max_record=MAX_RECORD_BYTES + 64)
    payloads = journal.open()
    journal.close()
    table, corrupt = MachineEvents(retain), 0
    for payload in payloads:
        try:
            table.apply(decode_record_untrusted(payload))
        except CorruptRecord as exc:
            corrupt += 1
            log.error("skipping unreadable event record", path=str(path), error=str(exc))
    return LegacyJournal(table, len(payloads), corrupt, journal.damage)


def set_aside(path: Path, how: str) -> Path:
    """Rename ``path`` to ``<name>.<how>-<UTC time>`` (fsynced). Blocking."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.{how}-{stamp}")
    n = 0
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.{how}-{stamp}-{n}")
    os.rename(path, target)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return target


async def import_legacy_journal(
    state: StateStore, path: Path, retain: int, node_name: str
) -> dict[str, Any]:
    """On the active node: import an earlier release's events journal once, then set it
    aside. Imported if the state holds no events yet, or an import this node began was
    cut short (its lease lost); otherwise the rack's events are already in the state and
    the journal is set aside unimported, with a warning. The report for the status.
    :class:`NotWriter` if the lease is lost meanwhile (the journal stays, for next time)."""
    legacy = await trio.to_thread.run_sync(read_legacy_journal, path, retain)
    if legacy is None:
        return {"outcome": "none", "damage": []}
    report: dict[str, Any] = {"file": str(path), "records": legacy.records, "corrupt": legacy.corrupt,
                              "damage": legacy.damage}  # fmt: skip
    marker = state.get(META_NS, IMPORT_KEY)
    resuming = (
        isinstance(marker, dict) and marker.get("node") == node_name and not marker.get("done")
    )
    if next(iter(state.scan(EVENTS_NS)), None) is not None and not resuming:
        aside = await trio.to_thread.run_sync(set_aside, path, "not-imported")
        log.warning("the events journal of an earlier release was not imported: the rack's "
                    "events are already in the state log; it is kept aside",
                    file=str(path), kept=str(aside))  # fmt: skip
        return {**report, "outcome": "not-imported", "kept": str(aside)}
    records = list(legacy.table.records())
    await state.put(META_NS, IMPORT_KEY, {"node": node_name, "done": False, "time": time.time()})
    written = 0
    for record in records:
        key, value = entry(record)
        if state.get(EVENTS_NS, key) is None:
            state.append(EVENTS_NS, key, value)
            written += 1
    await state.put(META_NS, IMPORT_KEY, {"node": node_name, "done": True, "time": time.time(),
                                          "entries": written})  # fmt: skip
    aside = await trio.to_thread.run_sync(set_aside, path, "imported")
    log.info("imported the events journal of an earlier release into the state log",
             file=str(path), entries=written, machines=len(legacy.table), kept=str(aside))  # fmt: skip
    return {**report, "outcome": "imported", "entries": written, "kept": str(aside)}
