"""Peer message framing: caps checked before reading, garbage refused, never a crash."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.cluster import wire


def test_messages_roundtrip_across_arbitrary_splits():
    messages = [{"t": "ping", "n": i, "role": "active"} for i in range(5)]
    data = b"".join(wire.encode(m) for m in messages)
    reader = wire.FrameReader()
    got = []
    for i in range(0, len(data), 3):
        got += reader.feed(data[i : i + 3])
    assert got == messages


def test_an_oversized_length_is_refused_before_the_body_arrives():
    reader = wire.FrameReader(max_size=4096)
    with pytest.raises(wire.MessageTooLarge, match="4097 bytes announced, the cap is 4096"):
        reader.feed(wire.HEADER.pack(4097))  # the header alone: nothing else was buffered
    assert len(reader._buf) == 4


def test_wanted_never_asks_past_one_message():
    reader = wire.FrameReader(max_size=100)
    assert reader.wanted() == 4
    reader.feed(wire.HEADER.pack(10) + b"\x81")
    assert reader.wanted() == 9


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1, 2]), "not a map"),
        (msgpack.packb({1: 2}), "not valid msgpack"),  # strict_map_key: only str keys
        (msgpack.packb({"t": "nope"}), "unknown message type 'nope'"),
        (msgpack.packb({"t": "ping", "n": "x", "role": "a"}), "field 'n'"),
        (msgpack.packb({"t": "ping", "n": True, "role": "a"}), "field 'n'"),
        (msgpack.packb({"t": "crl", "der": msgpack.ExtType(5, b"x")}), "extension type 5"),
        (msgpack.packb({"t": "pong", "n": 1}) + b"\x00", "not valid msgpack"),
    ],
)
def test_garbage_is_a_frame_error(body, reason):
    with pytest.raises(wire.FrameError, match=reason):
        wire.FrameReader().feed(wire.HEADER.pack(len(body)) + body)


def test_unknown_fields_are_tolerated():
    msg = {"t": "pong", "n": 3, "future": [1, 2]}
    assert wire.decode_untrusted(msgpack.packb(msg)) == msg


@given(st.binary(max_size=2048))
def test_any_bytes_give_messages_or_a_frame_error(data):
    reader = wire.FrameReader(max_size=1024)
    try:
        for message in reader.feed(data):
            assert isinstance(message, dict) and message["t"] in wire.MESSAGES
    except wire.FrameError:
        pass
