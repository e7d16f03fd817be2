"""What the state log holds, and its encoding (sans-IO).

The log is a run of entries, each one msgpack list in a CRC frame
(:mod:`appliance.frames`):

* a **record** ``[1, "r", epoch, lsn, namespace, key, value]``: ``key`` of
  ``namespace`` now holds ``value`` (``None``: deleted). ``lsn`` (log sequence
  number) rises by one per record, across epochs, on every node: a position
  in the log means the same thing everywhere. ``epoch`` is the rack lease's
  epoch (its fencing token) under which the holder wrote it;
* a **snapshot**: a head ``[1, "s", epoch, lsn, entries, history]`` saying
  that what follows is the whole state after record ``lsn`` (of ``epoch``),
  in ``entries`` entries ``[1, "e", namespace, key, value]``; compaction
  writes one at the start of the file and the records after it follow.
  ``history`` is the epoch history (:class:`EpochHistory`), which records
  alone no longer show once compacted.

The first element of every entry is its **format** (appliance/compat.py): this
software writes :data:`VERSION` and reads :data:`READS`; an entry of another
format is refused with a message saying so, never misread. The replication
stream never sends a follower records of a format it does not read (see
appliance/state/replication.py).

Decoding is for bytes read from disk or from a peer: sizes are capped before
anything is unpacked, map keys must be strings, extension types are refused,
and every shape is checked; anything else is :class:`BadEntry`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from appliance import compat

VERSION = compat.THIS.log_writes  # the format this software writes
READS = compat.THIS.log  # the formats it reads
MAX_NAMESPACE = 64
MAX_KEY = 512
MAX_ENTRY = 64 * 1024  # bytes of one encoded entry
MAX_HISTORY = 256  # epochs remembered; older ones only matter to followers that far behind


class BadEntry(ValueError):
    """Bytes that are not a well-formed log entry."""


@dataclass(frozen=True, slots=True)
class Record:
    epoch: int
    lsn: int
    ns: str
    key: str
    value: Any  # None: the key was deleted


@dataclass(frozen=True, slots=True)
class SnapshotHead:
    epoch: int
    lsn: int
    entries: int
    history: tuple[tuple[int, int], ...]  # (epoch, first lsn), oldest first


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    ns: str
    key: str
    value: Any


Entry = Record | SnapshotHead | SnapshotEntry


class EpochHistory:
    """Where each epoch's records start: ``(epoch, first_lsn)``, rising in both.

    A follower that comes back says the epoch and LSN of its last record; the
    leader answers with the last LSN it holds of that epoch (:meth:`end_of`):
    anything the follower has beyond it was written by a deposed holder and
    never committed, so it is cut (Kafka's leader-epoch check, in one call).
    """

    def __init__(self, entries: Iterable[tuple[int, int]] = ()) -> None:
        self.entries: list[tuple[int, int]] = list(entries)

    def note(self, epoch: int, lsn: int) -> None:
        """Record ``lsn`` was written under ``epoch``."""
        if not self.entries or epoch > self.entries[-1][0]:
            self.entries.append((epoch, lsn))
            del self.entries[:-MAX_HISTORY]

    def end_of(self, epoch: int, last_lsn: int) -> int | None:
        """The last LSN of ``epoch`` in this log (``last_lsn`` is the log's end), or None
        when this log knows nothing about that epoch (older than its history)."""
        if not self.entries or epoch < self.entries[0][0]:
            return None
        for (e, _), after in zip(self.entries, [*self.entries[1:], None], strict=True):
            if e <= epoch and (after is None or after[0] > epoch):
                return last_lsn if after is None else after[1] - 1
        return None

    def current(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def as_tuple(self) -> tuple[tuple[int, int], ...]:
        return tuple(self.entries)


def encode(entry: Entry) -> bytes:
    if isinstance(entry, Record):
        fields: list[Any] = [VERSION, "r", entry.epoch, entry.lsn, entry.ns, entry.key, entry.value]
    elif isinstance(entry, SnapshotHead):
        fields = [VERSION, "s", entry.epoch, entry.lsn, entry.entries,
                  [list(pair) for pair in entry.history]]  # fmt: skip
    else:
        fields = [VERSION, "e", entry.ns, entry.key, entry.value]
    data = msgpack.packb(fields, use_bin_type=True)
    if len(data) > MAX_ENTRY:
        raise ValueError(f"a state entry of {len(data)} bytes is larger than {MAX_ENTRY}")
    return data


def _no_ext(code: int, data: bytes) -> Any:
    raise BadEntry(f"msgpack extension type {code}")


def unpack_untrusted(data: bytes, max_bytes: int) -> Any:
    """msgpack from an untrusted source: capped, string map keys, no extension types."""
    if len(data) > max_bytes:
        raise BadEntry(f"{len(data)} bytes, more than {max_bytes}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_no_ext)
    except BadEntry:
        raise
    except Exception as exc:  # msgpack raises several types on garbage
        raise BadEntry(f"undecodable: {type(exc).__name__}") from None


def _uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _name(value: Any, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit


def decode_untrusted(data: bytes) -> Entry:
    fields = unpack_untrusted(data, MAX_ENTRY)
    if not isinstance(fields, list) or len(fields) < 2:
        raise BadEntry("not a state entry")
    if fields[0] not in READS or isinstance(fields[0], bool):
        raise BadEntry(
            f"a state entry of format {str(fields[0])[:12]}: rackboot {compat.THIS.version} "
            f"reads state log formats {READS} (a newer appliance wrote it?)"
        )
    kind = fields[1]
    if kind == "r" and len(fields) == 7:
        _, _, epoch, lsn, ns, key, value = fields
        if _uint(epoch) and _uint(lsn) and lsn > 0 and _name(ns, MAX_NAMESPACE) and _name(
            key, MAX_KEY
        ):
            return Record(epoch, lsn, ns, key, value)
    elif kind == "s" and len(fields) == 6:
        _, _, epoch, lsn, entries, history = fields
        if _uint(epoch) and _uint(lsn) and _uint(entries) and _history(history):
            return SnapshotHead(epoch, lsn, entries, tuple((e, f) for e, f in history))
    elif kind == "e" and len(fields) == 5:
        _, _, ns, key, value = fields
        if _name(ns, MAX_NAMESPACE) and _name(key, MAX_KEY) and value is not None:
            return SnapshotEntry(ns, key, value)
    raise BadEntry(f"malformed state entry of kind {str(kind)[:8]!r}")


def _history(value: Any) -> bool:
    if not isinstance(value, list) or len(value) > MAX_HISTORY:
        return False
    pairs = [p for p in value if isinstance(p, list) and len(p) == 2 and all(map(_uint, p))]
    return len(pairs) == len(value) and all(
        a[0] < b[0] and a[1] <= b[1] for a, b in zip(pairs, pairs[1:], strict=False)
    )
