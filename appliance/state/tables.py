"""The committed state: namespaces of keys and values, at a position of the log (sans-IO).

A table changes only by :meth:`Tables.apply` of the next record, in LSN
order, once that record is committed (never speculatively): replaying the
log or receiving it from the leader builds the same tables on every node.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from appliance.state.records import EpochHistory, Record, SnapshotEntry, SnapshotHead


class OutOfOrder(ValueError):
    """A record that is not the next one."""


class Tables:
    def __init__(self) -> None:
        self.data: dict[str, dict[str, Any]] = {}
        self.epoch = 0  # of the last record applied
        self.lsn = 0  # the last record applied
        self.history = EpochHistory()

    def apply(self, record: Record) -> None:
        if record.lsn != self.lsn + 1:
            raise OutOfOrder(f"record {record.lsn} after {self.lsn}")
        if record.epoch < self.epoch:
            raise OutOfOrder(f"record {record.lsn} of epoch {record.epoch} after epoch {self.epoch}")
        table = self.data.setdefault(record.ns, {})
        if record.value is None:
            table.pop(record.key, None)
            if not table:
                del self.data[record.ns]
        else:
            table[record.key] = record.value
        self.history.note(record.epoch, record.lsn)
        self.epoch, self.lsn = record.epoch, record.lsn

    def restore(self, head: SnapshotHead, entries: list[SnapshotEntry]) -> None:
        """Replace everything with a snapshot's content."""
        self.data = {}
        for entry in entries:
            self.data.setdefault(entry.ns, {})[entry.key] = entry.value
        self.epoch, self.lsn = head.epoch, head.lsn
        self.history = EpochHistory(head.history)

    def snapshot(self) -> tuple[SnapshotHead, list[SnapshotEntry]]:
        entries = [
            SnapshotEntry(ns, key, value)
            for ns, table in sorted(self.data.items())
            for key, value in table.items()
        ]
        return SnapshotHead(self.epoch, self.lsn, len(entries), self.history.as_tuple()), entries

    def get(self, ns: str, key: str, default: Any = None) -> Any:
        return self.data.get(ns, {}).get(key, default)

    def scan(self, ns: str, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """Keys of ``ns`` starting with ``prefix``, in key order."""
        table = self.data.get(ns, {})
        for key in sorted(k for k in table if k.startswith(prefix)):
            yield key, table[key]

    def count(self) -> int:
        return sum(len(table) for table in self.data.values())
