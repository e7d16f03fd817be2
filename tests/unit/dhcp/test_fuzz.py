"""Hostile bytes into parse_untrusted: a Message or MalformedPacket, never anything else.

Runs under the active hypothesis profile: ``RACKBOOT_TEST_PROFILE=long`` gives
each test 100,000 examples.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from plugins.dhcp.codec import (
    MAGIC_COOKIE,
    REASONS,
    EncodeError,
    MalformedPacket,
    build,
    parse_untrusted,
)

from .strategies import big_option_maps, messages, raw_packets
from .test_codec import IPXE_DISCOVER, SLIRP_OFFER


def survives(data: bytes) -> None:
    try:
        msg = parse_untrusted(data)
    except MalformedPacket as e:
        assert e.reason in REASONS
        return
    # anything we accept we can send back, and it reads the same
    assert parse_untrusted(build(msg, max_size=65_535)) == msg


@given(st.binary(max_size=1500))
def test_arbitrary_bytes(data):
    survives(data)


# Most arbitrary bytes die at the cookie: these reach the option parser.
headers = st.builds(
    lambda op, hlen, rest: bytes([op, 1, hlen]) + rest,
    st.sampled_from([1, 2]),
    st.integers(0, 16),
    st.binary(min_size=233, max_size=233),
)
option_bytes = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.sampled_from([b"\x00", b"\xff", b"\x34\x01\x03", b"\x35\x01\x01", b"\x2b\xff"]),
        st.integers(1, 254).flatmap(
            lambda c: st.binary(max_size=20).map(lambda v: bytes([c, len(v)]) + v)
        ),
    ),
    max_size=30,
).map(b"".join)


@given(headers, option_bytes)
@example(bytes([1, 1, 6]) + bytes(233), b"\x34\x01\x03")  # overload with empty fields
@example(bytes([1, 1, 6]) + bytes(233), b"\x34\x01\x03\x34")
def test_arbitrary_options_after_a_valid_header(header, options):
    survives(header + MAGIC_COOKIE + options)


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, where, byte in edits:
        where %= len(out) + 1
        if kind == 0 and where < len(out):
            out[where] = byte  # overwrite
        elif kind == 1:
            out.insert(where, byte)
        elif kind == 2 and where < len(out):
            del out[where]
        elif kind == 3:
            del out[where:]  # truncate
    return bytes(out)


def build_or_empty(msg) -> bytes:
    try:
        return build(msg)  # at 576 bytes: overload and split options
    except EncodeError:
        return b""


valid_packets = st.one_of(
    st.sampled_from([IPXE_DISCOVER, SLIRP_OFFER]),
    raw_packets(),
    messages().map(lambda m: build(m, max_size=1500)),
    messages(big_option_maps()).map(build_or_empty),
)
interesting = st.one_of(st.integers(0, 255), st.sampled_from([0, 1, 2, 3, 52, 53, 99, 255]))
edits = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 2000), interesting), min_size=1, max_size=8
)


@given(valid_packets, edits)
def test_mutated_valid_packets(packet, changes):
    survives(mutate(packet, changes))
