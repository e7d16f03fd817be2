"""A state log in memory that models a disk honestly (for the simulation, and for tests that
want a :class:`~appliance.state.store.StateStore` without files).

It has :class:`~appliance.state.log.StateLog`'s interface (``open()``,
``journal.append(data, count)``, ``journal.rewrite(payloads)``, ``tables_upto(lsn)``,
``close()``, ``path``) over one byte string, the file, in the journal's framing
(:mod:`appliance.frames`), and reads it back with the real code
(:func:`~appliance.frames.scan_untrusted`, :func:`~appliance.state.log.read_entries`).

What a disk does that matters here:

* bytes written are what a read sees at once (the page cache), but only the first
  :attr:`MemLog.durable` bytes survive a crash; :meth:`MemLog.write` then
  :meth:`MemLog.sync` is an append and its ``fdatasync``, which a caller may split
  (the simulation sleeps between the two on its mock clock);
* :meth:`MemLog.crash` is a power loss: what was not synced is lost, except, at the
  caller's choice, a prefix of it (a torn write: some sectors made it), which the
  reader cuts off as a torn tail when the log is opened again;
* a rewrite (compaction, a cut, a snapshot installed) is atomic (a new file fsynced and
  renamed over the old one): :meth:`MemLog.replace` swaps the whole content at once,
  durable, and a crash before it leaves the old file.

Used synchronously (``journal.append`` writes and syncs at once) it is simply a log in
memory.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import PurePosixPath

from appliance.frames import frame, scan_untrusted
from appliance.state.log import Recovery, read_entries
from appliance.state.records import MAX_ENTRY
from appliance.state.tables import Tables


class MemJournal:
    """The journal half of the interface: what StateStore's writer calls."""

    def __init__(self, log: MemLog) -> None:
        self.log = log

    def append(self, data: bytes, count: int) -> None:
        """``count`` framed records: written and synced (StateStore runs this through its
        ``blocking`` callable, which may split it, see the module docstring)."""
        self.log.write(data)
        self.log.sync()

    def rewrite(self, payloads: Iterable[bytes]) -> None:
        self.log.replace(b"".join(frame(p) for p in payloads))


class MemLog:
    def __init__(self, name: str = "log") -> None:
        self.path = PurePosixPath(f"/sim/{name}/state/log")
        self.journal = MemJournal(self)
        self.content = bytearray()  # the file as a read sees it
        self.durable = 0  # how much of it survives a crash
        self.generation = 0  # bumped whenever bytes are replaced or lost (not appended)
        self.torn = 0  # torn tails cut at open
        self.open_count = 0
        self._parsed: tuple[tuple[int, int], Recovery] | None = None
        self.resync = False  # StateLog's marker file: a damaged log to be sent again

    # -- StateLog's interface ------------------------------------------------------

    def open(self) -> Recovery:
        """What JournalFile.open and StateLog.open do: a torn tail is cut, the rest read
        back into tables."""
        self.open_count += 1
        scan = scan_untrusted(bytes(self.content), MAX_ENTRY)
        if scan.end < len(self.content):  # a torn tail (damage in the middle: not modelled)
            self.torn += 1
            del self.content[scan.end :]
            self.durable = min(self.durable, len(self.content))
            self.generation += 1
        recovery = read_entries(scan.payloads)
        recovery.repair = bool(recovery.problem)
        return recovery

    def wants_resync(self) -> bool:
        return self.resync

    def set_resync(self, wanted: bool) -> None:
        self.resync = wanted

    def tables_upto(self, lsn: int) -> Tables:
        recovery = read_entries(scan_untrusted(bytes(self.content), MAX_ENTRY).payloads, lsn)
        return recovery.tables if recovery.tables.lsn == lsn else Tables()

    def close(self) -> None:
        pass

    # -- the disk ------------------------------------------------------------------

    def write(self, data: bytes) -> int:
        """Append to the page cache; returns where the new bytes start."""
        start = len(self.content)
        self.content += data
        return start

    def sync(self) -> None:
        """fdatasync: everything written so far survives a crash."""
        self.durable = len(self.content)

    def replace(self, data: bytes) -> None:
        """An atomic rewrite, durable when it returns."""
        self.content = bytearray(data)
        self.durable = len(data)
        self.generation += 1

    @property
    def unsynced(self) -> int:
        return len(self.content) - self.durable

    def crash(self, rng: random.Random | None = None, torn: float = 0.5) -> int:
        """Power lost: the bytes not synced are gone, but with probability ``torn`` (when an
        ``rng`` is given) a random prefix of them reached the disk. Returns the bytes lost."""
        pending = self.unsynced
        torn_write = rng is not None and pending and rng.random() < torn
        keep = rng.randrange(pending + 1) if torn_write else 0
        del self.content[self.durable + keep :]
        self.durable = len(self.content)
        if pending:
            self.generation += 1
        return pending - keep

    def durable_recovery(self) -> Recovery:
        """What a restart would read back now (the durable bytes, a torn tail cut)."""
        key = (self.generation, self.durable)
        if self._parsed is None or self._parsed[0] != key:
            scan = scan_untrusted(bytes(self.content[: self.durable]), MAX_ENTRY)
            self._parsed = (key, read_entries(scan.payloads))
        return self._parsed[1]
