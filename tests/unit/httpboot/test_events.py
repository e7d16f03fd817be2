"""Installer events: what is accepted, the per-machine table fed by the state's changes
and resets, state entries and keys, the old journal's records."""

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
    entry,
    event_key,
    from_entry_untrusted,
    parse_event_untrusted,
    parse_key_untrusted,
)

MAC = "52:54:00:12:34:56"
# C0 but tab and newline, DEL, C1 (NEL U+0085 and the one-character CSI U+009B among them),
# the bidirectional embeddings, overrides (U+202A-U+202E) and isolates (U+2066-U+2069)
CONTROLS_REFUSED = [
    "\x00", "\x1b", "\x7f", "\x80", "\x85", "\x9b", "\x9f",
    "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
]  # fmt: skip


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
        (b'{"stage":"x","status":"ok","status":"failed"}', "duplicate key 'status'"),
        (b'{"stage":"x","stage":"x","status":"ok"}', "duplicate key 'stage'"),
        (b'{"stage":"x","status":"ok","message":"a","message":"a"}', "duplicate key 'message'"),
        (b'{"stage":"x","status":"ok","message":{"a":1,"a":2}}', "duplicate key 'a'"),
        *(
            (f'{{"stage":"x","status":"ok","message":"a{char}b"}}'.encode(), "message")
            for char in CONTROLS_REFUSED
            if char >= "\x7f"  # raw UTF-8 (raw C0 in a string is not JSON at all)
        ),
        *(  # and as JSON escapes
            (body(stage="x", status="ok", message=f"a{char}b"), "message")
            for char in CONTROLS_REFUSED
        ),
        (b" " * 5000, "over 4096 bytes"),
    ],
    ids=lambda value: value[:20] if isinstance(value, bytes) else value,
)
def test_refused_events_say_which_rule(raw, rule):
    with pytest.raises(BadEvent, match=rule.replace("[", r"\[")):
        parse_event_untrusted(raw, 4096)


@pytest.mark.parametrize("char", CONTROLS_REFUSED, ids=lambda c: f"U+{ord(c):04X}")
def test_entries_and_journal_records_refuse_what_a_post_may_not_carry(char):
    """A peer's state entry or an old journal's record is parsed under the same rules."""
    event = Event(MAC, 7, 1.0e9, "installed", "ok", f"a{char}b", "10.0.0.5")
    with pytest.raises(CorruptRecord):
        from_entry_untrusted(*entry(event))
    with pytest.raises(CorruptRecord):
        decode_record_untrusted(encode_record(event))


def test_neighbours_of_the_refused_ranges_are_accepted():
    text = "tab\tnewline\n\u00a0\u2029\u202f\u2065\u206a dönë"
    assert parse_event_untrusted(body(stage="x", status="ok", message=text), 4096)[2] == text
    event = Event(MAC, 7, 1.0e9, "installed", "ok", text, "10.0.0.5")
    assert from_entry_untrusted(*entry(event)) == event


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
    assert [e.seq for e in table.events(MAC)] == [3, 4, 5] and table.held() == 3
    cleared = table.clearing(MAC)
    table.apply(cleared)
    assert cleared == Cleared(MAC, 5) and table.events(MAC) == [] and table.held() == 0
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


# -- the table fed by the state log's changefeed --------------------------------------------


def put(table: MachineEvents, record: Event | Cleared) -> None:
    table.change(*entry(record))


def ev(seq: int, mac: str = MAC, stage: str = "s") -> Event:
    return Event(mac, seq, 1.0e9 + seq, f"{stage}{seq}", "progress", "m", "10.0.0.5")


def test_keys_sort_by_sequence_and_name_the_machine():
    assert event_key(MAC, 7) == "52:54:00:12:34:56/0000000007"
    assert sorted(event_key(MAC, n) for n in (10, 9, 100)) == [
        event_key(MAC, n) for n in (9, 10, 100)
    ]
    assert parse_key_untrusted("52:54:00:12:34:56/0000000007") == (MAC, 7)
    assert parse_key_untrusted("52:54:00:12:34:56/cleared") == (MAC, None)
    for bad in (
        "52:54:00:12:34:56",
        "52-54-00-12-34-56/1",
        "52:54:00:12:34:56/x",
        "AA:54:00:12:34:56/1",
        "/1",
    ):
        with pytest.raises(CorruptRecord):
            parse_key_untrusted(bad)


def test_entries_round_trip_and_refuse_what_is_not_an_event():
    event = Event(MAC, 7, 1700000000.5, "installed", "ok", "dönë", "10.0.0.5")
    assert from_entry_untrusted(*entry(event)) == event
    assert entry(Cleared(MAC, 3)) == (f"{MAC}/cleared", {"seq": 3})
    assert from_entry_untrusted(*entry(Cleared(MAC, 3))) == Cleared(MAC, 3)
    key = event_key(MAC, 1)
    for value in ([1], {"time": "t"}, {"time": 1.0, "stage": 5}, {"time": True}):
        with pytest.raises(CorruptRecord):
            from_entry_untrusted(key, value)
    with pytest.raises(CorruptRecord):
        from_entry_untrusted(f"{MAC}/cleared", {"seq": -1})


def test_the_table_follows_changes_puts_and_deletes():
    table = MachineEvents(retain=3)
    for seq in (1, 2, 3):
        put(table, ev(seq))
    put(table, ev(1, "52:54:00:00:00:02"))
    assert [e.seq for e in table.events(MAC)] == [1, 2, 3] and len(table) == 2
    assert list(table) == ["52:54:00:00:00:02", MAC]
    put(table, ev(4))  # before the writer's delete of 1 arrives, the table shows the last 3
    assert [e.seq for e in table.events(MAC)] == [2, 3, 4] and table.held() == 5
    assert table.stale(MAC, 4) == [1]  # what the writer deletes
    table.change(event_key(MAC, 1), None)
    assert table.held_seqs(MAC) == [2, 3, 4] and table.last(MAC) == ev(4)
    table.change(event_key(MAC, 9), None)  # a delete of what is not here changes nothing
    table.change(event_key("52:54:00:00:00:02", 1), None)
    assert list(table) == [MAC]


def test_a_cleared_marker_hides_what_it_covers_and_the_sequence_goes_on():
    table = MachineEvents(retain=3)
    for seq in (1, 2, 3):
        put(table, ev(seq))
    put(table, Cleared(MAC, 3))
    assert table.events(MAC) == [] and table.last(MAC) is None and table.last_seq(MAC) == 3
    assert table.stale(MAC, 3) == [1, 2, 3]
    for seq in (1, 2, 3):
        table.change(event_key(MAC, seq), None)
    assert len(table) == 1 and table.next_event(MAC, "x", "ok", "", 0.0, "").seq == 4


def test_sequence_numbers_never_reuse_what_the_committed_state_holds():
    """The changefeed runs a little behind commits: the store passes the state's own floor."""
    table = MachineEvents()
    assert table.next_event(MAC, "a", "ok", "", 0.0, "", floor=7).seq == 8
    assert table.next_event(MAC, "b", "ok", "", 0.0, "").seq == 9  # reserved
    assert table.clearing(MAC, floor=12) == Cleared(MAC, 12)


def test_a_reset_rebuilds_the_table_and_skips_what_is_not_an_event():
    table = MachineEvents(retain=2)
    put(table, ev(1))
    put(table, ev(5, "52:54:00:00:00:09"))
    items = dict(
        entry(record) for record in (ev(3), ev(4), Cleared(MAC, 3), ev(2, "52:54:00:00:00:02"))
    )
    items["garbage"] = {"time": 1.0}
    items[event_key(MAC, 9)] = "not a map"
    assert table.reset(items) == 2
    assert [e.seq for e in table.events(MAC)] == [4] and table.last_seq(MAC) == 4
    assert list(table) == ["52:54:00:00:00:02", MAC]  # the machine only the old table had: gone
    assert table.next_event(MAC, "x", "ok", "", 0.0, "").seq == 5


def test_the_old_journal_replays_into_records_to_import():
    """What an earlier release journaled (events, clearings, replays) comes out as the
    records the state gets: each machine's cleared marker and its last ``retain`` events."""
    old = MachineEvents(retain=2)
    other = "52:54:00:00:00:02"
    for record in (ev(1), ev(2), ev(3), ev(2), ev(1, other), Cleared(other, 1), ev(2, other)):
        old.apply(record)
    records = list(old.records())
    assert records == [Cleared(other, 1), ev(2, other), ev(2), ev(3)]
    fed = MachineEvents(retain=2)
    fed.reset(dict(entry(record) for record in records))
    for mac in (MAC, other):
        assert fed.events(mac) == old.events(mac) and fed.last_seq(mac) == old.last_seq(mac)


@given(
    st.lists(
        st.tuples(st.sampled_from([MAC, "52:54:00:00:00:02"]), st.integers(1, 30), st.booleans()),
        max_size=60,
    )
)
def test_changes_and_a_reset_to_the_same_content_agree(ops):
    """Whatever order of puts and deletes: the table fed change by change equals one reset
    to the namespace's final content (what a reader gets after a compaction)."""
    content: dict = {}
    fed = MachineEvents(retain=5)
    for mac, seq, delete in ops:
        key, value = entry(Cleared(mac, seq)) if seq % 7 == 0 else entry(ev(seq, mac))
        value = None if delete else value
        fed.change(key, value)
        if value is None:
            content.pop(key, None)
        else:
            content[key] = value
    reset = MachineEvents(retain=5)
    reset.reset(content)
    assert list(fed) == list(reset)
    for mac in fed:
        assert fed.events(mac) == reset.events(mac) and fed.last_seq(mac) == reset.last_seq(mac)


def test_machines_come_in_pages_after_a_mac():
    table = MachineEvents()
    macs = [f"52:54:00:00:00:{n:02x}" for n in range(5)]
    for mac in reversed(macs):
        put(table, ev(1, mac))
    put(table, Cleared("52:54:00:00:00:09", 2))  # a cleared machine is listed too
    assert table.page(None, 2) == macs[:2]
    assert table.page(macs[1], 2) == macs[2:4]
    assert table.page(macs[3], 10) == [macs[4], "52:54:00:00:00:09"]
    assert table.page("52:54:00:00:00:02", 1) == [macs[3]]  # a cursor need not be listed
    assert table.page("ff:ff:ff:ff:ff:ff", 5) == []
