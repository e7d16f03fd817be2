"""Installer events: validation of what a machine posts, the per-machine table,
and its journal records (sans-IO: the wall-clock time is passed in).

An event is ``{"stage": ..., "status": ..., "message": ...}``; the server adds
the time, the client address and a per-machine sequence number. A machine
keeps its last ``retain`` events; clearing a machine (an admin action) is a
record too, so the sequence never goes back.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import msgpack

STAGE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")
STATUSES = ("started", "progress", "ok", "failed")
MAX_MESSAGE = 1024
MAX_RECORD_BYTES = 4 * MAX_MESSAGE + 256  # UTF-8 message plus the fixed fields
RECORD_VERSION = 1
_EVENT, _CLEARED = 0, 1
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # tab and newline are fine in a message


class BadEvent(ValueError):
    """A posted event the server refuses (400); the text says which rule it broke."""


class CorruptRecord(ValueError):
    """A journal record that does not decode."""


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
        document = json.loads(body)
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
    if not isinstance(message, str) or len(message) > MAX_MESSAGE or _CONTROL.search(message):
        raise BadEvent(f"message: expected text of at most {MAX_MESSAGE} characters")
    return stage, status, message


class MachineEvents:
    """Every machine's recent events, newest last."""

    def __init__(self, retain: int = 256) -> None:
        self.retain = retain
        self._events: dict[str, deque[Event]] = {}
        self._last_seq: dict[str, int] = {}
        self._reserved: dict[str, int] = {}  # sequence numbers handed out, not yet durable
        self.retained = 0  # events held, all machines together

    def __len__(self) -> int:
        return len(self._last_seq)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._last_seq))

    def events(self, mac: str) -> list[Event]:
        return list(self._events.get(mac, ()))

    def last(self, mac: str) -> Event | None:
        events = self._events.get(mac)
        return events[-1] if events else None

    def next_event(
        self, mac: str, stage: str, status: str, message: str, now: float, client: str
    ) -> Event:
        """The event to record next for ``mac`` (applied once durable, by :meth:`apply`).

        Its sequence number is reserved at once: two posts in flight never share one.
        """
        seq = max(self._reserved.get(mac, 0), self._last_seq.get(mac, 0)) + 1
        self._reserved[mac] = seq
        return Event(mac, seq, now, stage, status, message, client)

    def clearing(self, mac: str) -> Cleared:
        return Cleared(mac, max(self._reserved.get(mac, 0), self._last_seq.get(mac, 0)))

    def apply(self, record: Event | Cleared) -> None:
        """A live change or a replayed one; replaying a record twice changes nothing."""
        if record.seq < self._last_seq.get(record.mac, 0) or (
            isinstance(record, Event) and record.seq == self._last_seq.get(record.mac)
        ):
            return
        self._last_seq[record.mac] = record.seq
        if isinstance(record, Cleared):
            self.retained -= len(self._events.pop(record.mac, ()))
            return
        events = self._events.setdefault(record.mac, deque(maxlen=self.retain))
        self.retained += len(events) < self.retain
        events.append(record)

    def records(self) -> Iterator[Event | Cleared]:
        """What a compacted journal holds: the retained events, or a machine's last sequence."""
        for mac in sorted(self._last_seq):
            events = self._events.get(mac)
            if events:
                yield from events
            else:
                yield Cleared(mac, self._last_seq[mac])


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
    if not (
        isinstance(time, int | float)
        and all(isinstance(v, str) for v in (stage, status, message, client))
    ):
        raise CorruptRecord("record with fields of the wrong type")
    return Event(text, seq, float(time), stage, status, message, client)
