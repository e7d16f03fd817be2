"""Typed option values: round trips, the RFC 3442 examples, and bad bytes."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.dhcp import options as o
from plugins.dhcp.options import EncodeError, MalformedPacket

addresses = st.integers(0, 2**32 - 1).map(IPv4Address)
networks = st.builds(
    lambda addr, width: IPv4Network((addr, width), strict=False), addresses, st.integers(0, 32)
)


@pytest.mark.parametrize(
    ("encode", "decode", "value"),
    [
        (o.encode_u8, o.decode_u8, 255),
        (o.encode_u16, o.decode_u16, 1472),
        (o.encode_u32, o.decode_u32, 86400),
        (o.encode_ip, o.decode_ip, IPv4Address("10.0.2.2")),
        (o.encode_ips, o.decode_ips, [IPv4Address("10.0.2.3"), IPv4Address("1.1.1.1")]),
        (o.encode_str, o.decode_str, "rack-node-7"),
        (o.encode_str, o.decode_str, "nön-ascii\udcff"),  # any bytes survive
        (o.encode_client_arches, o.decode_client_arches, [0, 7, 0x10]),
        (o.encode_user_classes, o.decode_user_classes, [b"iPXE", b"rack"]),
        (o.encode_param_request_list, o.decode_param_request_list, [1, 3, 6, 121]),
    ],
)
def test_round_trip(encode, decode, value):
    assert decode(encode(value)) == value


@given(st.lists(st.tuples(networks, addresses), min_size=1, max_size=20))
def test_routes_round_trip(routes):
    assert o.decode_routes(o.encode_routes(routes)) == routes


@given(st.lists(st.binary(min_size=1, max_size=255), max_size=10))
def test_user_classes_round_trip(classes):
    assert o.decode_user_classes(o.encode_user_classes(classes)) == classes


# RFC 3442 §"Classless Route Option Format": subnet number, mask, destination descriptor.
RFC3442_DESCRIPTORS = [
    ("0.0.0.0/0", [0]),
    ("10.0.0.0/8", [8, 10]),
    ("10.0.0.0/24", [24, 10, 0, 0]),
    ("10.17.0.0/16", [16, 10, 17]),
    ("10.27.129.0/24", [24, 10, 27, 129]),
    ("10.229.0.128/25", [25, 10, 229, 0, 128]),
    ("10.198.122.47/32", [32, 10, 198, 122, 47]),
]


@pytest.mark.parametrize(("network", "descriptor"), RFC3442_DESCRIPTORS)
def test_rfc3442_examples(network, descriptor):
    encoded = bytes(descriptor) + bytes([192, 0, 2, 1])
    assert o.encode_routes([(network, "192.0.2.1")]) == encoded
    assert o.decode_routes(encoded) == [(IPv4Network(network), IPv4Address("192.0.2.1"))]


def test_routes_ignore_bits_beyond_the_width():
    # 10.229.0.129/25 has a host bit set; decoded as the /25 network, like the RFC's clients
    assert o.decode_routes(bytes([25, 10, 229, 0, 129, 1, 2, 3, 4]))[0][0] == IPv4Network(
        "10.229.0.128/25"
    )


@pytest.mark.parametrize(
    ("decode", "value"),
    [
        (o.decode_u8, b""),
        (o.decode_u16, b"\x01"),
        (o.decode_u32, b"\x00\x00\x00\x00\x00"),
        (o.decode_ip, b"\x0a\x00\x00"),
        (o.decode_ips, b""),
        (o.decode_ips, b"\x0a\x00\x00\x01\x0a"),
        (o.decode_client_arches, b""),
        (o.decode_client_arches, b"\x00\x07\x00"),
        (o.decode_routes, b"\x00\x01\x02\x03"),  # shorter than the 5-byte minimum
        (o.decode_routes, bytes([33, 1, 2, 3, 4, 5, 1, 2, 3, 4])),  # width > 32
        (o.decode_routes, bytes([24, 10, 0, 0, 1, 2, 3])),  # router cut short
        (o.decode_routes, bytes([0, 1, 2, 3, 4, 8])),  # second route cut short
    ],
)
def test_bad_lengths_are_malformed(decode, value):
    with pytest.raises(MalformedPacket) as info:
        decode(value)
    assert info.value.reason == "bad-option-value"


@pytest.mark.parametrize(
    ("encode", "value"),
    [
        (o.encode_u8, 256),
        (o.encode_u16, -1),
        (o.encode_u32, 2**32),
        (o.encode_ip, "10.0.0.256"),
        (o.encode_ips, ["10.0.0.1", "nonsense"]),
        (o.encode_routes, [("10.0.0.1/8", "10.0.0.1")]),  # host bits: a typo, not a route
        (o.encode_routes, [("10.0.0.0/8", "::1")]),
        (o.encode_user_classes, [b""]),
        (o.encode_user_classes, [b"x" * 256]),
        (o.encode_client_arches, [0x10000]),
        (o.encode_param_request_list, [1, 256]),
    ],
)
def test_unencodable_values_raise_encode_error(encode, value):
    with pytest.raises(EncodeError):
        encode(value)


@pytest.mark.parametrize(
    ("value", "classes"),
    [
        (b"iPXE", [b"iPXE"]),  # what iPXE sends: the bare string
        (b"\x04iPXE", [b"iPXE"]),  # the RFC 3004 form of the same class
        (b"\x04iPXE\x04rack", [b"iPXE", b"rack"]),
        (b"MSFT 5.0", [b"MSFT 5.0"]),  # Windows' bare string
        (b"\x05iPXE", [b"\x05iPXE"]),  # a length that overruns: taken as one bare class
        (b"\x00", [b"\x00"]),  # RFC 3004 has no empty class
        (b"", []),
    ],
)
def test_user_class_reads_both_forms(value, classes):
    assert o.decode_user_classes(value) == classes


def test_string_drops_trailing_nul_some_clients_send():
    assert o.decode_str(b"host\0") == "host"


def test_malformed_packet_carries_a_reason():
    error = MalformedPacket("truncated-option", "option 12 at byte 250")
    assert isinstance(error, ValueError)
    assert (error.reason, str(error)) == (
        "truncated-option",
        "truncated-option: option 12 at byte 250",
    )


def test_enums_match_the_registry():
    assert (o.Opt.MESSAGE_TYPE, o.Opt.CLIENT_ARCH, o.Opt.SUBNET_SELECTION) == (53, 93, 118)
    assert [int(t) for t in o.MessageType][:8] == list(range(1, 9))
    assert o.MessageType.INFORM == 8
