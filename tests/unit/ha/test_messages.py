"""Election messages: round trips, and garbage refused with BadMessage only."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.ha import messages as m

SAMPLES = [
    m.Prepare("rack1", 7, 3, "d" * 32, ["ab" * 8, "cd" * 8]),
    m.Promise("rack1", 7, 3, False, "busy", "ab" * 8, 4, 0.75, 4, True, 5, "cd" * 8, "d" * 32),
    m.Propose("rack1", 7, 3, 5, 1.0, "d" * 32, ["ab" * 8]),
    m.Accepted("rack1", 7, 3, True, "", "ab" * 8, 1.0, 5, 3, "ab" * 8, "d" * 32),
    m.Release("rack1", 8, 5),
    m.Handover("rack1", 9, 4),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda x: x.TYPE)
def test_every_message_round_trips(message):
    data = m.encode(message)
    assert len(data) < 250
    assert m.decode_untrusted(data) == message


def body(**changes):
    raw = {
        "t": "prepare",
        "group": "rack1",
        "req": 1,
        "ballot": 1,
        "members": "d",
        "appliances": [],
    }
    raw.update(changes)
    return msgpack.packb(raw)


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1, 2]), "not a map"),
        (body(t="launch"), "unknown message type 'launch'"),
        (body(ballot="1"), "field 'ballot' missing or of the wrong type"),
        (body(ballot=True), "field 'ballot' missing or of the wrong type"),
        (body(ballot=-1), "field 'ballot' out of range"),
        (body(group="x" * 65), "field 'group' longer than 64"),
        (msgpack.packb({"t": "prepare", "group": "r", "req": 1, "ballot": 1}), "'members' missing"),
        (body(appliances=["a"] * 18), "not valid msgpack"),  # over the array cap
        (body(appliances=[1]), "'appliances' is not a list"),
        (body(appliances="ab"), "'appliances' missing or of the wrong type"),
        (msgpack.packb({"t": "handover", "group": "r", "req": 1, "x": msgpack.ExtType(1, b"")}),
         "extension type"),
        (b"\x80" + b"\x00" * 2000, "exceeds the cap of 1024"),
    ],
)  # fmt: skip
def test_garbage_is_refused_with_a_reason(data, reason):
    with pytest.raises(m.BadMessage, match=reason):
        m.decode_untrusted(data)


def test_a_float_out_of_range_is_refused():
    raw = m.encode(SAMPLES[2]).replace(msgpack.packb(1.0), msgpack.packb(1e9))
    with pytest.raises(m.BadMessage, match="'lease' out of range"):
        m.decode_untrusted(raw)


@pytest.mark.parametrize("value", [10**15, True, 3601, -1, float("nan"), float("inf")])
def test_an_int_or_bool_in_a_float_field_is_checked_like_a_float(value):
    """``left=1e15`` as an int used to pass unchecked, and True passed as 1.0."""
    promise = m.Promise("rack1", 1, 1, False, "busy", "a", 1, 0.5, 1, False, 0, "", "d" * 32)
    raw = msgpack.unpackb(m.encode(promise))
    raw["left"] = value
    with pytest.raises(m.BadMessage, match="'left'"):
        m.decode_untrusted(msgpack.packb(raw))
    raw["left"] = 2  # a whole number of seconds is a float like any other
    assert m.decode_untrusted(msgpack.packb(raw)).left == 2.0


def test_extra_keys_from_a_newer_peer_are_ignored():
    assert m.decode_untrusted(body(future=1)) == m.Prepare("rack1", 1, 1, "d", [])


@pytest.mark.parametrize("message", SAMPLES, ids=lambda x: x.TYPE)
def test_the_senders_revocation_list_number_rides_beside_every_message(message):
    data = m.encode(message, crl=7)
    assert m.decode_with_crl_untrusted(data) == (message, 7)
    assert m.decode_untrusted(data) == message  # what an older decoder sees: an extra key
    assert m.decode_with_crl_untrusted(m.encode(message)) == (message, None)  # an older sender


@pytest.mark.parametrize("message", SAMPLES, ids=lambda x: x.TYPE)
def test_the_senders_version_and_election_protocols_ride_beside_every_message(message):
    data = m.encode(message, crl=3, speaks=("1.2.0", [1, 2]))
    assert m.decode_stated_untrusted(data) == (message, m.Stated(3, "1.2.0", [1, 2]))
    assert m.decode_untrusted(data) == message  # an older decoder: extra keys
    assert m.decode_stated_untrusted(m.encode(message)) == (message, m.Stated())  # an older sender
    assert len(data) < m.MAX_MESSAGE


@pytest.mark.parametrize("value", [-1, 2**63, True, "7", 7.0, [7]])
def test_a_stated_number_out_of_range_or_of_another_type_is_refused(value):
    with pytest.raises(m.BadMessage, match="prepare: field 'crl'"):
        m.decode_with_crl_untrusted(body(crl=value))


@given(st.binary(max_size=1100))
def test_arbitrary_bytes_raise_only_bad_message(data):
    try:
        m.decode_untrusted(data)
    except m.BadMessage:
        pass


@given(st.dictionaries(st.sampled_from(["t", "group", "req", "ballot", "members", "ok", "left", "appliances", "crl"]),
                       st.one_of(st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=70), st.booleans(),
                                 st.none(), st.sampled_from(list(m.TYPES)))))  # fmt: skip
def test_arbitrary_maps_raise_only_bad_message(raw):
    try:
        _, crl = m.decode_with_crl_untrusted(msgpack.packb(raw))
    except m.BadMessage:
        pass
    else:
        assert crl is None or 0 <= crl < 2**63
