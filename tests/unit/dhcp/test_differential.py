"""Our codec against an independent one: scapy's BOOTP/DHCP layers, in both directions.

Scapy quirks the comparison works around (scapy 2.8):

* it knows nothing of RFC 3396: repeated options come out one per instance, so
  we concatenate its instances per code before comparing;
* it ignores option overload 52: the options in ``file``/``sname`` are decoded
  here with its own ``DHCPOptionsField``, in the RFC 3396 order;
* it keeps reading after END (we stop), so generated packets hold only PADs there;
* a typed option whose length does not suit its field (say a 3-byte subnet mask,
  an empty router list, or a parameter list of over 100 codes) makes it give up
  on the rest of the field: the generators give typed options lengths scapy's
  fields can decode;
* its ``sname``/``file``/``chaddr`` are the raw fixed-size fields; ours lose
  trailing NULs (``sname``/``file``).
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.dhcp.codec import EncodeError, Message, build, parse_untrusted
from plugins.dhcp.options import VALUE_LENGTHS, Opt, decode_ips, decode_routes

from .strategies import (
    addresses,
    big_option_maps,
    codes,
    messages,
    option_value,
    raw_packets,
    u8,
    u16,
    u32,
)

scapy_dhcp = pytest.importorskip("scapy.layers.dhcp")  # the oracle: never imported by the product
from scapy.compat import raw  # noqa: E402
from scapy.fields import FieldListField, StrField  # noqa: E402

BOOTP, DHCP, DHCP_OPTIONS = scapy_dhcp.BOOTP, scapy_dhcp.DHCP, scapy_dhcp.DHCPOptions
OPTIONS_FIELD = scapy_dhcp.DHCPOptionsField("options", b"")


RAW, ROUTES, BYTE_LIST = 0, -1, -2


def scapy_shape(code: int) -> int:
    """RAW: any bytes; ROUTES: RFC 3442; BYTE_LIST: <= 100 bytes; n > 0: a multiple of n bytes."""
    field = DHCP_OPTIONS.get(code)
    if field is None or isinstance(field, str | StrField):
        return RAW
    if isinstance(field, scapy_dhcp.ClasslessFieldListField):
        return ROUTES
    if isinstance(field, FieldListField):
        return BYTE_LIST  # scapy refuses lists over conf.max_list_count (100) items
    return field.sz


@st.composite
def route_bytes(draw) -> bytes:
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        width = draw(st.integers(0, 32))
        out += bytes([width]) + draw(
            st.binary(min_size=(width + 7) // 8, max_size=(width + 7) // 8)
        )
        out += draw(st.binary(min_size=4, max_size=4))
    return out


def scapy_value(code: int, max_size: int = 255) -> st.SearchStrategy[bytes]:
    """A value both decoders take whole: ours (accessor lengths) and scapy's typed fields."""
    shape = scapy_shape(code)
    if code in VALUE_LENGTHS or code == Opt.MESSAGE_TYPE:
        return option_value(code, max_size)
    if shape == ROUTES:
        return route_bytes()
    if shape in (RAW, BYTE_LIST):
        return st.binary(max_size=max_size if shape == RAW else min(max_size, 100))
    return st.integers(1, max_size // shape).flatmap(
        lambda n: st.binary(min_size=n * shape, max_size=n * shape)
    )


def repeatable(code: int) -> bool:
    return scapy_shape(code) == RAW and code not in VALUE_LENGTHS


@st.composite
def tlvs(draw) -> list[tuple[int, bytes]]:
    chosen = draw(st.lists(codes, unique=True, max_size=10))
    items = [(c, draw(scapy_value(c))) for c in chosen]
    for code in filter(repeatable, chosen):  # RFC 3396: up to 4 instances, any order of codes
        items += [(code, v) for v in draw(st.lists(st.binary(max_size=40), max_size=3))]
    return draw(st.permutations(items))


def scapy_raw(pkt, entry) -> tuple[int, bytes]:
    """One scapy option entry back to (code, value bytes), through scapy's own encoders."""
    assert isinstance(entry, tuple), f"scapy gave up decoding at {entry!r}"
    name, *values = entry
    if isinstance(name, int):
        return name, b"".join(values)
    code, field = scapy_dhcp.DHCPRevOptions[name]
    if field is None:
        return code, b"".join(values)
    return code, b"".join(field.addfield(pkt, b"", v) for v in values)


def scapy_options(pkt, *fields: bytes) -> dict[int, bytes]:
    entries = list(pkt[DHCP].options) if DHCP in pkt else []
    found: dict[int, bytes] = {}
    for area in (entries, *(OPTIONS_FIELD.m2i(pkt, f) for f in fields)):
        for entry in area:
            if entry == "end":
                break  # scapy reads on past END; the RFC stops there
            if entry == "pad":
                continue
            code, value = scapy_raw(pkt, entry)
            if code != Opt.OVERLOAD:  # framing, which our Message does not keep
                found[code] = found.get(code, b"") + value  # RFC 3396, which scapy lacks
    return found


def route(text: str) -> tuple[IPv4Network, IPv4Address]:
    destination, router = text.split(":")
    return IPv4Network(destination, strict=False), IPv4Address(router)


# Options scapy decodes to typed values, checked against our accessors and decoders.
TYPED = {
    "message-type": lambda m, v: m.message_type == v[0],
    "server_id": lambda m, v: m.server_id == IPv4Address(v[0]),
    "requested_addr": lambda m, v: m.requested_ip == IPv4Address(v[0]),
    "subnet-selection": lambda m, v: m.subnet_selection == IPv4Address(v[0]),
    "subnet_mask": lambda m, v: decode_ips(m.options[1]) == [IPv4Address(a) for a in v],
    "router": lambda m, v: decode_ips(m.options[3]) == [IPv4Address(a) for a in v],
    "lease_time": lambda m, v: m.lease_time == v[0],
    "max_dhcp_size": lambda m, v: m.max_message_size == v[0],
    "param_req_list": lambda m, v: m.parameter_request_list == v[0],
    "hostname": lambda m, v: m.options[12] == v[0],
    "client_id": lambda m, v: m.client_id == v[0],
    "classless_static_routes": lambda m, v: (
        decode_routes(m.options[121]) == [route(r) for r in v[0]]
    ),
}


def assert_typed(ours: Message, entries: list) -> None:
    named = [e for e in entries if isinstance(e, tuple) and e[0] in TYPED]
    for name, *values in named:
        if sum(e[0] == name for e in named) == 1:  # a repeat is checked as bytes only
            assert TYPED[name](ours, values), (name, values)


def assert_same(ours: Message, wire: bytes) -> None:
    pkt = BOOTP(wire)
    header = (pkt.op, pkt.htype, pkt.hlen, pkt.hops, pkt.xid, pkt.secs, int(pkt.flags))
    assert (ours.op, ours.htype, ours.hlen, ours.hops, ours.xid, ours.secs, ours.flags) == header
    for name in ("ciaddr", "yiaddr", "siaddr", "giaddr"):
        assert getattr(ours, name) == IPv4Address(getattr(pkt, name))
    assert ours.chaddr == pkt.chaddr
    overload = scapy_overload(pkt)
    extra = [f for bit, f in ((1, pkt.file), (2, pkt.sname)) if overload & bit]
    if not overload & 1:
        assert ours.file == pkt.file.rstrip(b"\0")
    if not overload & 2:
        assert ours.sname == pkt.sname.rstrip(b"\0")
    assert ours.options == scapy_options(pkt, *extra)
    assert_typed(ours, list(pkt[DHCP].options) if DHCP in pkt and not overload else [])


def scapy_overload(pkt) -> int:
    """Option 52's value in the options field, as scapy decodes it (it does not act on it)."""
    for entry in pkt[DHCP].options if DHCP in pkt else []:
        if entry == "end":
            break
        if isinstance(entry, tuple) and entry[0] == "dhcp-option-overload":
            return entry[1]
    return 0


@given(raw_packets(tlvs()))
def test_crafted_packets_decode_alike(wire):
    assert_same(parse_untrusted(wire), wire)


def scapy_friendly_options(max_size: int) -> st.SearchStrategy[dict[int, bytes]]:
    return st.lists(codes, unique=True, max_size=12).flatmap(
        lambda cs: st.fixed_dictionaries({c: scapy_value(c, max_size) for c in cs})
    )


@given(messages(scapy_friendly_options(max_size=60)))
def test_our_build_decodes_alike(msg):
    wire = build(msg, max_size=1500)  # 12 options of <= 60 bytes: one field, one instance each
    assert_same(msg, wire)


# Overload and RFC 3396 splitting: only options scapy keeps raw may be cut anywhere.
raw_codes = codes.filter(repeatable)
big_raw_options = big_option_maps(raw_codes)


@given(messages(big_raw_options))
def test_overloaded_and_split_options_decode_alike(msg):
    try:
        wire = build(msg)
    except EncodeError:
        return  # does not fit in 576 bytes: test_codec covers that path
    assert_same(msg, wire)


# The other direction: scapy builds, typed, and we decode.
ip_text = addresses.map(str)
route_text = st.builds(
    lambda addr, width, router: f"{addr}/{width}:{router}", ip_text, st.integers(0, 32), ip_text
)
SCAPY_OPTIONS = {
    "message-type": st.integers(1, 8).map(lambda n: (n,)),
    "server_id": ip_text.map(lambda a: (a,)),
    "requested_addr": ip_text.map(lambda a: (a,)),
    "subnet_mask": ip_text.map(lambda a: (a,)),
    "router": st.lists(ip_text, min_size=1, max_size=4).map(tuple),
    "lease_time": u32.map(lambda n: (n,)),
    "max_dhcp_size": u16.map(lambda n: (n,)),
    "param_req_list": st.lists(u8, max_size=30).map(lambda codes: (codes,)),
    "hostname": st.binary(min_size=1, max_size=60).map(lambda b: (b,)),
    "client_id": st.binary(min_size=2, max_size=40).map(lambda b: (b,)),
    "classless_static_routes": st.lists(route_text, min_size=1, max_size=5).map(lambda r: (r,)),
}


NAMED_CODES = {scapy_dhcp.DHCPRevOptions[name][0] for name in SCAPY_OPTIONS}
unnamed_raw_codes = raw_codes.filter(lambda c: c not in NAMED_CODES)


@st.composite
def scapy_packets(draw):
    names = draw(st.lists(st.sampled_from(sorted(SCAPY_OPTIONS)), unique=True, max_size=8))
    options = [(name, *draw(SCAPY_OPTIONS[name])) for name in names]
    options += [
        (c, draw(st.binary(max_size=50)))
        for c in draw(st.lists(unnamed_raw_codes, unique=True, max_size=3))
    ]
    options += draw(st.sampled_from([["end"], [], ["end", "pad", "pad"]]))
    header = BOOTP(
        op=draw(st.sampled_from([1, 2])), htype=draw(u8), hlen=draw(st.integers(0, 16)),
        hops=draw(u8), xid=draw(u32), secs=draw(u16), flags=draw(u16),
        ciaddr=draw(ip_text), yiaddr=draw(ip_text), siaddr=draw(ip_text), giaddr=draw(ip_text),
        chaddr=draw(st.binary(min_size=16, max_size=16)),
        sname=draw(st.binary(max_size=64)), file=draw(st.binary(max_size=128)),
    )  # fmt: skip
    return header / DHCP(options=options), dict(
        (o[0], o[1:]) for o in options if isinstance(o, tuple)
    )


@given(scapy_packets())
def test_scapy_built_packets_decode_to_what_scapy_was_given(packet):
    pkt, given_options = packet
    wire = raw(pkt)
    msg = parse_untrusted(wire)
    assert_same(msg, wire)
    assert_typed(msg, [(name, *values) for name, values in given_options.items()])
    for code, values in given_options.items():
        if isinstance(code, int):
            assert msg.options[code] == values[0]
