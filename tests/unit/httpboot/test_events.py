"""Installer events: what is accepted, the per-machine table, journal records."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.httpboot.events import (
    BadEvent,
    Cleared,
    CorruptRecord,
    Event,
    MachineEvents,
    decode_record_untrusted,
    encode_record,
    parse_event_untrusted,
)

MAC = "52:54:00:12:34:56"


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_a_valid_event():
    assert parse_event_untrusted(body(stage="installed", status="ok", message="done\n"), 4096) == (
        "installed", "ok", "done\n",
    )  # fmt: skip
    assert parse_event_untrusted(body(stage="disk.1", status="started"), 4096) == (
        "disk.1", "started", "",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1]", "JSON object"),
        (b"[" * 4000, "not JSON"),  # deep nesting is a refusal, not a crash
        (body(stage="x", status="ok", extra=1), "unknown key 'extra'"),
        (body(status="ok"), "stage"),
        (body(stage="Installed", status="ok"), "stage"),
        (body(stage="-x", status="ok"), "stage"),
        (body(stage="x" * 33, status="ok"), "stage"),
        (body(stage=1, status="ok"), "stage"),
        (body(stage="x", status="done"), "status"),
        (body(stage="x"), "status"),
        (body(stage="x", status="ok", message=5), "message"),
        (body(stage="x", status="ok", message="m" * 1025), "message"),
        (body(stage="x", status="ok", message="\x1b[2J"), "message"),  # no terminal escapes
        (b" " * 5000, "over 4096 bytes"),
    ],
    ids=lambda value: value[:20] if isinstance(value, bytes) else value,
)
def test_refused_events_say_which_rule(raw, rule):
    with pytest.raises(BadEvent, match=rule.replace("[", r"\[")):
        parse_event_untrusted(raw, 4096)


def test_sequence_numbers_are_reserved_and_rise():
    table = MachineEvents()
    first = table.next_event(MAC, "a", "started", "", 1.0, "10.0.0.5")
    second = table.next_event(MAC, "b", "ok", "", 2.0, "10.0.0.5")  # before the first is durable
    assert (first.seq, second.seq) == (1, 2)
    table.apply(first)
    table.apply(second)
    table.apply(first)  # replayed: nothing changes
    assert [e.stage for e in table.events(MAC)] == ["a", "b"]
    assert table.last(MAC) == second and list(table) == [MAC]
    assert table.next_event("52:54:00:00:00:01", "a", "ok", "", 3.0, "").seq == 1


def test_retention_and_clearing_keep_the_sequence():
    table = MachineEvents(retain=3)
    for i in range(5):
        table.apply(table.next_event(MAC, f"s{i}", "progress", "", float(i), ""))
    assert [e.seq for e in table.events(MAC)] == [3, 4, 5] and table.retained == 3
    cleared = table.clearing(MAC)
    table.apply(cleared)
    assert cleared == Cleared(MAC, 5) and table.events(MAC) == [] and table.retained == 0
    assert table.next_event(MAC, "again", "ok", "", 9.0, "").seq == 6
    assert list(table.records()) == [Cleared(MAC, 5)]


def test_compacted_records_replay_to_the_same_table():
    table = MachineEvents(retain=2)
    for i in range(4):
        table.apply(table.next_event(MAC, f"s{i}", "ok", "m", float(i), "10.0.0.5"))
    table.apply(table.clearing("52:54:00:00:00:02"))
    replayed = MachineEvents(retain=2)
    for record in table.records():
        replayed.apply(decode_record_untrusted(encode_record(record)))
    assert replayed.events(MAC) == table.events(MAC)
    assert replayed.next_event(MAC, "x", "ok", "", 0.0, "").seq == 5


def test_records_round_trip():
    event = Event(MAC, 7, 1700000000.5, "installed", "ok", "dönë", "10.0.0.5")
    assert decode_record_untrusted(encode_record(event)) == event
    assert decode_record_untrusted(encode_record(Cleared(MAC, 3))) == Cleared(MAC, 3)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgpack.packb([2, 0, b"\x00" * 6, 1]),
        msgpack.packb([1, 0, b"\x00" * 5, 1, 0.0, "a", "ok", "", ""]),
        msgpack.packb([1, 0, b"\x00" * 6, -1, 0.0, "a", "ok", "", ""]),
        msgpack.packb([1, 0, b"\x00" * 6, 1, "t", "a", "ok", "", ""]),
        msgpack.packb([1, 9, b"\x00" * 6, 1]),
        msgpack.packb({"a": 1}),
        b"\x00" * 10_000,
    ],
)
def test_corrupt_records(payload):
    with pytest.raises(CorruptRecord):
        decode_record_untrusted(payload)


@given(st.binary(max_size=300))
def test_garbage_only_ever_raises_corrupt_record(payload):
    try:
        decode_record_untrusted(payload)
    except CorruptRecord:
        pass
