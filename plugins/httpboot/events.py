"""Installer events: validation of what a machine posts, the per-machine table, how an
event is kept in the state log, and the old journal's records (sans-IO: the wall-clock
time is passed in).

An event is ``{"stage": ..., "status": ..., "message": ...}``; the server adds
the time, the client address and a per-machine sequence number. Events live in
the node's state (namespace :data:`EVENTS_NS`, docs/state.md), one key per event:

* ``"<mac>/<seq>"`` (``52:54:00:12:34:56/0000000007``): the event, never overwritten;
  deleted (a ``None`` record) when it falls out of the machine's last ``retain``;
* ``"<mac>/cleared"``: ``{"seq": N}``, every event of the machine up to ``N`` was
  cleared (an admin action), so its sequence never goes back.

:class:`MachineEvents` is the table the routes read, fed by the namespace's changes
(and rebuilt by a reset) on every node alike. The journal records (:func:`encode_record`,
:func:`decode_record_untrusted`) are those of the events journal of earlier releases,
read once to import it.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import msgpack

STAGE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")
STATUSES = ("started", "progress", "ok", "failed")
MAX_MESSAGE = 1024
MAX_CLIENT = 64  # the client's address as text
MAX_RECORD_BYTES = 4 * MAX_MESSAGE + 256  # UTF-8 message plus the fixed fields
RECORD_VERSION = 1
_EVENT, _CLEARED = 0, 1
# Tab and newline are fine in a message. Refused: the other C0 controls and DEL, the C1
# controls (U+0080-U+009F: U+009B is a one-character terminal CSI, U+0085 a line break
# to some readers) and the bidirectional embeddings, overrides and isolates, which make
# a log line or an operator's screen show text in another order than it was sent.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

EVENTS_NS = "httpboot.events"
CLEARED = "cleared"
_KEY = re.compile(r"([0-9a-f]{2}(?::[0-9a-f]{2}){5})/(?:([0-9]{1,19})|cleared)")
_FIELDS = ("time", "stage", "status", "message", "client")


class BadEvent(ValueError):
    """A posted event the server refuses (400); the text says which rule it broke."""


class CorruptRecord(ValueError):
    """A journal record, or a state entry, that does not decode."""


@dataclass(frozen=True)
class Event:
    mac: str
    seq: int
    time: float
    stage: str
    status: str
    message: str = ""
    client: str = ""

    def as_json(self) -> dict[str, Any]:
        fields = asdict(self)
        del fields["mac"]
        return fields


@dataclass(frozen=True)
class Cleared:
    """Every event of ``mac`` up to ``seq`` was deleted."""

    mac: str
    seq: int


def parse_event_untrusted(body: bytes, max_bytes: int) -> tuple[str, str, str]:
    """``(stage, status, message)`` of a posted JSON body, or :class:`BadEvent`."""
    if len(body) > max_bytes:
        raise BadEvent(f"body over {max_bytes} bytes")
    try:
        document = json.loads(body, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise BadEvent(f"duplicate key {str(exc)[:40]!r}") from None
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise BadEvent("body is not JSON") from None
    if not isinstance(document, dict):
        raise BadEvent("expected a JSON object")
    unknown = sorted(set(document) - {"stage", "status", "message"})
    if unknown:
        raise BadEvent(f"unknown key {unknown[0]!r} (known: message, stage, status)")
    stage, status = document.get("stage"), document.get("status")
    message = document.get("message", "")
    if not isinstance(stage, str) or not STAGE.fullmatch(stage):
        raise BadEvent("stage: expected 1-32 of a-z 0-9 _ . - (starting with a letter or digit)")
    if status not in STATUSES:
        raise BadEvent(f"status: expected one of {', '.join(STATUSES)}")
    if not _text_ok(message, MAX_MESSAGE):
        raise BadEvent(f"message: expected text of at most {MAX_MESSAGE} characters")
    return stage, status, message


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: with ``{"status": "ok", "status":
    "failed"}`` two readers (a proxy, a log, this server) may each see another event."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise _DuplicateKey(key)
        document[key] = value
    return document


def _text_ok(text: object, limit: int) -> bool:
    return isinstance(text, str) and len(text) <= limit and not _CONTROL.search(text)


def _texts_ok(stage: object, status: object, message: object, client: object) -> bool:
    """An event's texts as a post would have been accepted: what another writer (the
    state log of a peer, an old journal) hands over is held to the same rules."""
    return (
        isinstance(stage, str)
        and STAGE.fullmatch(stage) is not None
        and status in STATUSES
        and _text_ok(message, MAX_MESSAGE)
        and _text_ok(client, MAX_CLIENT)
    )


# -- state entries -------------------------------------------------------------------


def event_key(mac: str, seq: int) -> str:
    """The state key of event ``seq`` of ``mac`` (zero-padded: keys sort by sequence)."""
    return f"{mac}/{seq:010d}"


def cleared_key(mac: str) -> str:
    return f"{mac}/{CLEARED}"


def entry(record: Event | Cleared) -> tuple[str, dict[str, Any]]:
    """``(key, value)`` of ``record`` in :data:`EVENTS_NS`."""
    if isinstance(record, Cleared):
        return cleared_key(record.mac), {"seq": record.seq}
    return event_key(record.mac, record.seq), {f: getattr(record, f) for f in _FIELDS}


def parse_key_untrusted(key: str) -> tuple[str, int | None]:
    """``(mac, seq)`` of an event's key, ``(mac, None)`` of a machine's cleared marker."""
    match = _KEY.fullmatch(key)
    if match is None:
        raise CorruptRecord(f"not an events key: {key[:40]!r}")
    return match[1], None if match[2] is None else int(match[2])


def from_entry_untrusted(key: str, value: Any) -> Event | Cleared:
    """The record a state entry of :data:`EVENTS_NS` holds (``value`` not ``None``).

    For plugins that follow the namespace themselves (``node.state.subscribe``)."""
    mac, seq = parse_key_untrusted(key)
    if not isinstance(value, Mapping):
        raise CorruptRecord(f"{key}: not a map")
    if seq is None:
        cleared = value.get("seq")
        if not isinstance(cleared, int) or isinstance(cleared, bool) or cleared < 0:
            raise CorruptRecord(f"{key}: no sequence")
        return Cleared(mac, cleared)
    when = value.get("time")
    texts = [value.get(f, "") for f in _FIELDS[1:]]
    if not isinstance(when, int | float) or isinstance(when, bool) or not _texts_ok(*texts):
        raise CorruptRecord(f"{key}: fields of the wrong type or refused text")
    return Event(mac, seq, float(when), *texts)


# -- the table -----------------------------------------------------------------------


class MachineEvents:
    """Every machine's events, as the state holds them, newest last.

    Fed by :meth:`change` (one committed change of :data:`EVENTS_NS`) and
    :meth:`reset` (the namespace's whole content), or by :meth:`apply` (a record
    of the old journal). It shows a machine's last ``retain`` events after its
    cleared marker; the writer deletes older ones (:meth:`stale`).
    """

    def __init__(self, retain: int = 256) -> None:
        self.retain = retain
        self._events: dict[str, dict[int, Event]] = {}  # mac -> seq -> event
        self._cleared: dict[str, int] = {}  # mac -> events up to this were cleared
        self._reserved: dict[str, int] = {}  # sequence numbers handed out, not yet committed

    def __len__(self) -> int:
        return len(self._events.keys() | self._cleared.keys())

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._events.keys() | self._cleared.keys()))

    def page(self, after: str | None, limit: int) -> list[str]:
        """At most ``limit`` machines in MAC order, those after ``after`` (None: from the
        first). A MAC is a stable cursor: a machine added meanwhile is not skipped twice."""
        macs = sorted(self._events.keys() | self._cleared.keys())
        start = bisect.bisect_right(macs, after) if after is not None else 0
        return macs[start : start + limit]

    def held(self) -> int:
        """Events held, all machines together (shown or not yet deleted)."""
        return sum(len(events) for events in self._events.values())

    def events(self, mac: str) -> list[Event]:
        held = self._events.get(mac, {})
        after = self._cleared.get(mac, 0)
        shown = sorted(seq for seq in held if seq > after)[-self.retain :]
        return [held[seq] for seq in shown]

    def last(self, mac: str) -> Event | None:
        held = self._events.get(mac, {})
        newest = max(held, default=0)
        return held[newest] if newest > self._cleared.get(mac, 0) else None

    def last_seq(self, mac: str) -> int:
        """The highest sequence number ``mac`` has had (an event or its cleared marker)."""
        return max(max(self._events.get(mac, {}), default=0), self._cleared.get(mac, 0))

    def next_event(
        self, mac: str, stage: str, status: str, message: str, now: float, client: str,
        floor: int = 0,
    ) -> Event:  # fmt: skip
        """The event to record next for ``mac``, numbered past ``floor`` too (what the
        committed state holds that this table may not show yet).

        Its sequence number is reserved at once: two posts in flight never share one.
        """
        seq = max(self._reserved.get(mac, 0), self.last_seq(mac), floor) + 1
        self._reserved[mac] = seq
        return Event(mac, seq, now, stage, status, message, client)

    def clearing(self, mac: str, floor: int = 0) -> Cleared:
        return Cleared(mac, max(self._reserved.get(mac, 0), self.last_seq(mac), floor))

    def held_seqs(self, mac: str) -> list[int]:
        """Sequence numbers of every event of ``mac`` held (shown or not)."""
        return sorted(self._events.get(mac, {}))

    def stale(self, mac: str, newest: int) -> list[int]:
        """Sequence numbers of ``mac`` held but no longer shown once ``newest`` is: past
        the last ``retain``, or cleared. What the writer deletes."""
        cut = max(newest - self.retain, self._cleared.get(mac, 0))
        return sorted(seq for seq in self._events.get(mac, {}) if seq <= cut)

    # -- feeding -----------------------------------------------------------------------

    def change(self, key: str, value: Any) -> Event | Cleared | None:
        """One committed change of the namespace (``value`` ``None``: deleted); the record
        it sets, if any. :class:`CorruptRecord` if the entry is not an event's."""
        if value is None:
            mac, seq = parse_key_untrusted(key)
            if seq is None:
                self._cleared.pop(mac, None)
            else:
                held = self._events.get(mac)
                if held is not None:
                    held.pop(seq, None)
                    if not held:
                        del self._events[mac]
            return None
        record = from_entry_untrusted(key, value)
        self._set(record)
        return record

    def reset(self, items: Mapping[str, Any]) -> int:
        """Start over from the namespace's whole content; the number of entries skipped."""
        self._events, self._cleared = {}, {}
        skipped = 0
        for key, value in items.items():
            try:
                self.change(key, value)
            except CorruptRecord:
                skipped += 1
        return skipped

    def _set(self, record: Event | Cleared) -> None:
        if isinstance(record, Cleared):
            self._cleared[record.mac] = record.seq
        else:
            self._events.setdefault(record.mac, {})[record.seq] = record

    def apply(self, record: Event | Cleared) -> None:
        """A record of the old journal, replayed in order: an event older than the
        machine's last is a replay (ignored); a clearing drops what it covers and only
        the last ``retain`` events are kept."""
        last = self.last_seq(record.mac)
        if record.seq < last or (isinstance(record, Event) and record.seq == last):
            return
        self._set(record)
        held = self._events.get(record.mac, {})
        for seq in self.stale(record.mac, record.seq):
            del held[seq]
        if not held:
            self._events.pop(record.mac, None)

    def records(self) -> Iterator[Event | Cleared]:
        """What the table shows, as records: each machine's cleared marker, then its events."""
        for mac in self:
            if mac in self._cleared:
                yield Cleared(mac, self._cleared[mac])
            yield from self.events(mac)


def entries(records: Iterable[Event | Cleared]) -> Iterator[tuple[str, dict[str, Any]]]:
    return (entry(record) for record in records)


# -- the old journal's records -------------------------------------------------------


def encode_record(record: Event | Cleared) -> bytes:
    mac = bytes.fromhex(record.mac.replace(":", ""))
    if isinstance(record, Cleared):
        fields = [RECORD_VERSION, _CLEARED, mac, record.seq]
    else:
        e = record
        fields = [
            RECORD_VERSION,
            _EVENT,
            mac,
            e.seq,
            e.time,
            e.stage,
            e.status,
            e.message,
            e.client,
        ]
    return msgpack.packb(fields, use_bin_type=True)


def decode_record_untrusted(payload: bytes) -> Event | Cleared:
    """One journal record; :class:`CorruptRecord` on anything unexpected."""
    if len(payload) > MAX_RECORD_BYTES:
        raise CorruptRecord("record too long")
    try:
        fields = msgpack.unpackb(
            payload, use_list=True, raw=False, strict_map_key=True, max_bin_len=16,
            max_str_len=MAX_RECORD_BYTES, max_array_len=16, max_map_len=0, max_ext_len=0,
        )  # fmt: skip
    except Exception as exc:  # msgpack raises several types on garbage
        raise CorruptRecord(f"undecodable record: {type(exc).__name__}") from None
    if not isinstance(fields, list) or len(fields) < 4 or fields[0] != RECORD_VERSION:
        raise CorruptRecord("record of unknown shape or version")
    kind, mac, seq = fields[1:4]
    if not (isinstance(mac, bytes) and len(mac) == 6 and isinstance(seq, int) and seq >= 0):
        raise CorruptRecord("record with a bad machine or sequence")
    text = mac.hex(":")
    if kind == _CLEARED and len(fields) == 4:
        return Cleared(text, seq)
    if kind != _EVENT or len(fields) != 9:
        raise CorruptRecord("record of unknown kind")
    time, stage, status, message, client = fields[4:]
    if not isinstance(time, int | float) or not _texts_ok(stage, status, message, client):
        raise CorruptRecord("record with fields of the wrong type or refused text")
    return Event(text, seq, float(time), stage, status, message, client)
