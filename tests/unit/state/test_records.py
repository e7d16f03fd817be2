"""State log entries: encoding, the untrusted decoder, the epoch history."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.state.records import (
    MAX_ENTRY,
    BadEntry,
    EpochHistory,
    Record,
    SnapshotEntry,
    SnapshotHead,
    decode_untrusted,
    encode,
)

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)  # fmt: skip


@given(st.integers(0, 2**40), st.integers(1, 2**40), st.text(min_size=1, max_size=64),
       st.text(min_size=1, max_size=100), VALUES)  # fmt: skip
def test_records_round_trip(epoch, lsn, ns, key, value):
    record = Record(epoch, lsn, ns, key, value)
    assert decode_untrusted(encode(record)) == record


def test_snapshots_round_trip():
    head = SnapshotHead(3, 40, 2, ((1, 1), (3, 17)))
    assert decode_untrusted(encode(head)) == head
    entry = SnapshotEntry("leases", "10.0.0.5", [1, b"\x01\x02", "x"])
    assert decode_untrusted(encode(entry)) == entry


@pytest.mark.parametrize(
    "fields",
    [
        [2, "r", 1, 1, "ns", "k", 1],  # unknown version
        [1, "r", 1, 0, "ns", "k", 1],  # LSN 0
        [1, "r", -1, 1, "ns", "k", 1],
        [1, "r", True, 1, "ns", "k", 1],  # a bool is not an epoch
        [1, "r", 1, 1, "", "k", 1],
        [1, "r", 1, 1, "n" * 65, "k", 1],
        [1, "r", 1, 1, "ns", b"k", 1],
        [1, "r", 1, 1, "ns", "k"],
        [1, "s", 1, 1, 2, [[3, 1], [2, 5]]],  # history must rise
        [1, "s", 1, 1, 2, [[1]]],
        [1, "e", "ns", "k", None],  # a snapshot holds no deletions
        [1, "x"],
        {"r": 1},
        "r",
    ],
)
def test_malformed_entries_are_refused(fields):
    with pytest.raises(BadEntry):
        decode_untrusted(msgpack.packb(fields, use_bin_type=True))


@pytest.mark.parametrize("format", [2, 0, True, "1"])
def test_an_entry_of_a_format_this_software_does_not_read_is_refused_saying_so(format):
    with pytest.raises(BadEntry, match=f"format {format}: rackboot .* reads state log formats 1"):
        decode_untrusted(msgpack.packb([format, "r", 1, 1, "ns", "k", 1], use_bin_type=True))


def test_untrusted_bytes_are_capped_and_extension_types_refused():
    with pytest.raises(BadEntry):
        decode_untrusted(b"\x00" * (MAX_ENTRY + 1))
    with pytest.raises(BadEntry):
        decode_untrusted(msgpack.packb([1, "r", 1, 1, "ns", "k", msgpack.ExtType(1, b"x")]))
    with pytest.raises(BadEntry):  # non-string map keys
        decode_untrusted(msgpack.packb([1, "r", 1, 1, "ns", "k", {1: 2}]))
    with pytest.raises(ValueError):
        encode(Record(1, 1, "ns", "k", b"x" * MAX_ENTRY))


@given(st.binary(max_size=200))
def test_garbage_is_bad_entry_or_a_valid_entry(data):
    try:
        decode_untrusted(data)
    except BadEntry:
        pass


def test_epoch_history_tells_where_each_epoch_ends():
    history = EpochHistory()
    for epoch, lsn in ((1, 1), (1, 2), (1, 3), (4, 4), (4, 5), (7, 6)):
        history.note(epoch, lsn)
    assert history.entries == [(1, 1), (4, 4), (7, 6)]
    assert history.end_of(1, 9) == 3
    assert history.end_of(2, 9) == 3  # an epoch this log never wrote ends where 1 did
    assert history.end_of(4, 9) == 5
    assert history.end_of(7, 9) == 9 and history.end_of(8, 9) == 9
    assert history.end_of(0, 9) is None  # older than anything known
    assert EpochHistory().end_of(1, 0) is None
