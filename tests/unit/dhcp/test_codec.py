"""The BOOTP/DHCP message codec: real packets, round trips, overload, RFC 3396, every bound."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.dhcp.codec import (
    MAGIC_COOKIE,
    MAX_PACKET,
    MIN_BOOTP,
    EncodeError,
    MalformedPacket,
    Message,
    build,
    parse_untrusted,
)
from plugins.dhcp.options import MessageType, Opt

from .strategies import big_option_maps, messages


def captured(fixed_hex: str, options_hex: str, size: int) -> bytes:
    """A captured packet: its first 44 bytes, all-zero sname and file, cookie + options, zeros."""
    fixed = bytes.fromhex(fixed_hex)
    assert len(fixed) == 44
    return (fixed + bytes(192) + bytes.fromhex(options_hex)).ljust(size, b"\0")


# Header up to chaddr: op htype hlen hops | xid | secs flags | ciaddr yiaddr siaddr giaddr | chaddr
ZERO_ADDRESSES = "00000000 00000000 00000000 00000000"
QEMU_MAC, NETNS_MAC = "525400123456 00000000000000000000", "525400aabb01 00000000000000000000"

# Captured here: iPXE (Debian ipxe-qemu, pxe-virtio.rom) booting in qemu, user networking.
IPXE_DISCOVER = captured(
    f"01010600 2029615e 0004 0000 {ZERO_ADDRESSES} {QEMU_MAC}",
    "63825363 350101 390205c0 5d020000 5e03010201"
    "3c20505845436c69656e743a417263683a30303030303a554e44493a303032303031"  # PXEClient:Arch...
    "4d0469505845"  # user class: the bare string "iPXE", not RFC 3004
    "3717010306070c0f111a2b3c4243778081828384858687afcb"
    "af30b105011af41000eb03010000170101220101130101110101270101190101290101100102210101150101180101120101"
    "3d0701525400123456 6111 00 78563412bc9af0de1122334455667788"  # UUID, SMBIOS byte order
    "ff",
    400,
)
IPXE_REQUEST = captured(
    f"01010600 2029615e 0012 0000 {ZERO_ADDRESSES} {QEMU_MAC}",
    IPXE_DISCOVER[236:-1].hex().replace("350101", "350103", 1) + "36040a000202 32040a00020f ff",
    412,
)
# The reply qemu's built-in DHCP server (slirp) sent it: padded to 548 bytes.
SLIRP_OFFER = captured(
    f"02010600 2029615e 0000 0000 00000000 0a00020f 0a000202 00000000 {QEMU_MAC}",
    "63825363 350102 36040a000202 0104ffffff00 03040a000202 06040a000203 330400015180 ff",
    548,
)
# busybox 1.35 `udhcpc -x hostname:rack-node-7 -O 121`, in a network namespace.
UDHCPC_DISCOVER = captured(
    f"01010600 bef73419 0000 0000 {ZERO_ADDRESSES} {NETNS_MAC}",
    "63825363 350101 39020240 37080103060c0f1c2a79 0c0b7261636b2d6e6f64652d37"
    "3c0c756468637020312e33352e30 3d0701525400aabb01 ff",
    300,
)
# ISC dhclient 4.4 with Debian's dhclient.conf: no client id, chaddr identifies it.
DHCLIENT_DISCOVER = captured(
    f"01010600 7ca32c19 0000 0000 {ZERO_ADDRESSES} {NETNS_MAC}",
    "63825363 350101 0c02766d 370d011c02030f06770c2c2f1a792a ff",
    300,
)


def test_ipxe_discover():
    msg = parse_untrusted(IPXE_DISCOVER)
    assert (msg.op, msg.xid, msg.secs, msg.mac) == (1, 0x2029615E, 4, "52:54:00:12:34:56")
    assert msg.message_type is MessageType.DISCOVER
    assert msg.max_message_size == 1472
    assert msg.client_arches == [0]  # BIOS
    assert msg.options[Opt.CLIENT_NDI] == b"\x01\x02\x01"  # UNDI 2.1
    assert msg.vendor_class == b"PXEClient:Arch:00000:UNDI:002001"
    assert b"iPXE" in msg.user_classes
    assert msg.client_id == b"\x01" + bytes.fromhex("525400123456")
    assert msg.options[Opt.CLIENT_UUID][0] == 0 and len(msg.options[Opt.CLIENT_UUID]) == 17
    assert Opt.BOOTFILE_NAME in msg.parameter_request_list
    assert len(msg.options[Opt.IPXE_ENCAPSULATED]) == 48  # unknown to us: kept as bytes
    assert not msg.broadcast and msg.requested_ip is None and msg.server_id is None
    # same option order, no padding needed: our encoding of it is byte for byte iPXE's
    assert build(msg, max_size=1472) == IPXE_DISCOVER


def test_ipxe_request_and_the_reply_it_got():
    request = parse_untrusted(IPXE_REQUEST)
    assert request.message_type is MessageType.REQUEST
    assert request.server_id == IPv4Address("10.0.2.2")
    assert request.requested_ip == IPv4Address("10.0.2.15")
    offer = parse_untrusted(SLIRP_OFFER)
    assert (offer.op, offer.message_type, offer.xid) == (2, MessageType.OFFER, request.xid)
    assert (offer.yiaddr, offer.siaddr) == (IPv4Address("10.0.2.15"), IPv4Address("10.0.2.2"))
    assert offer.lease_time == 86400 and offer.options[Opt.SUBNET_MASK] == b"\xff\xff\xff\x00"
    assert build(offer) == SLIRP_OFFER[:300]  # we pad to 300 only


@pytest.mark.parametrize("wire", [UDHCPC_DISCOVER, DHCLIENT_DISCOVER], ids=["udhcpc", "dhclient"])
def test_linux_clients_discover(wire):
    msg = parse_untrusted(wire)
    assert msg.message_type is MessageType.DISCOVER and msg.mac == "52:54:00:aa:bb:01"
    assert Opt.CLASSLESS_STATIC_ROUTES in msg.parameter_request_list
    assert build(msg) == wire  # same order, same 300-byte padding


def test_udhcpc_and_dhclient_specifics():
    udhcpc, dhclient = parse_untrusted(UDHCPC_DISCOVER), parse_untrusted(DHCLIENT_DISCOVER)
    assert udhcpc.hostname == "rack-node-7" and udhcpc.vendor_class == b"udhcp 1.35.0"
    assert udhcpc.max_message_size == 576 and udhcpc.client_id == b"\x01" + udhcpc.chaddr[:6]
    assert dhclient.hostname == "vm" and dhclient.client_id is None


def wire_size(options: dict[int, bytes]) -> int:
    return sum(len(v) + 2 * max(1, -(-len(v) // 255)) for v in options.values())


@given(st.one_of(messages(), messages(big_option_maps())), st.sampled_from([576, 1500, 65535]))
def test_round_trip(msg, max_size):
    try:
        wire = build(msg, max_size=max_size)
    except EncodeError:
        assert wire_size(msg.options) > max_size - 28 - 240 - 1  # it did not fit unaided
        return
    assert MIN_BOOTP <= len(wire) <= max(MIN_BOOTP, max_size - 28)
    assert parse_untrusted(wire) == msg
    if Opt.MESSAGE_TYPE in msg.options:
        assert wire[240] == Opt.MESSAGE_TYPE


def options_field(*tlvs: bytes, end: bytes = b"\xff") -> bytes:
    return MAGIC_COOKIE + b"".join(tlvs) + end


def packet(options: bytes, *, sname: bytes = b"", file: bytes = b"", head: bytes = b"") -> bytes:
    head = head or bytes([1, 1, 6, 0]) + bytes(24) + bytes.fromhex("525400aabb01") + bytes(10)
    return head + sname.ljust(64, b"\0") + file.ljust(128, b"\0") + options


def tlv(code: int, value: bytes) -> bytes:
    return bytes((code, len(value))) + value


DISCOVER = tlv(53, b"\x01")


def test_overload_reads_options_then_file_then_sname():
    wire = packet(
        options_field(DISCOVER, tlv(52, b"\x03"), tlv(43, b"one-")),
        file=tlv(43, b"two-") + tlv(67, b"boot.ipxe") + b"\xff",
        sname=tlv(43, b"three") + tlv(66, b"tftp") + b"\xff",
    )
    msg = parse_untrusted(wire)
    assert msg.options == {53: b"\x01", 43: b"one-two-three", 67: b"boot.ipxe", 66: b"tftp"}
    assert (msg.sname, msg.file) == (b"", b"")  # they carried options, so no names


@pytest.mark.parametrize(("overload", "sname", "file"), [(1, b"srv", b""), (2, b"", b"pxe.0")])
def test_overload_of_one_field_leaves_the_other_a_name(overload, sname, file):
    opts = tlv(12, b"host") + b"\xff"
    wire = packet(
        options_field(DISCOVER, tlv(52, bytes([overload]))),
        sname=opts if overload == 2 else sname,
        file=opts if overload == 1 else file,
    )
    msg = parse_untrusted(wire)
    assert (msg.options[12], msg.sname, msg.file) == (b"host", sname, file)
    assert Opt.OVERLOAD not in msg.options


def test_fields_without_overload_are_names_even_if_they_look_like_options():
    msg = parse_untrusted(packet(options_field(DISCOVER), file=tlv(12, b"host")))
    assert msg.file == tlv(12, b"host") and 12 not in msg.options


def test_repeated_options_are_concatenated_in_order():  # RFC 3396
    wire = packet(
        options_field(tlv(43, b"ab"), DISCOVER, tlv(43, b""), tlv(43, b"cd"), tlv(43, b"e"))
    )
    msg = parse_untrusted(wire)
    assert msg.options[43] == b"abcde" and list(msg.options) == [43, 53]


def test_concatenation_can_make_an_accessor_option_whole():
    wire = packet(options_field(tlv(54, b"\x0a\x00"), tlv(54, b"\x00\x01"), DISCOVER))
    assert parse_untrusted(wire).server_id == IPv4Address("10.0.0.1")


def test_pads_end_and_what_follows():
    wire = packet(
        options_field(b"\0\0", DISCOVER, b"\0", tlv(12, b"h"), end=b"\xff\x01\x99garbage")
    )
    assert parse_untrusted(wire).options == {53: b"\x01", 12: b"h"}


def test_missing_end_is_tolerated_after_whole_options():
    msg = parse_untrusted(packet(options_field(DISCOVER, tlv(12, b"host"), end=b"")))
    assert msg.options == {53: b"\x01", 12: b"host"}
    assert parse_untrusted(packet(MAGIC_COOKIE)).options == {}  # BOOTP-sized, no options at all


def test_zero_length_and_unknown_options_are_kept():
    msg = parse_untrusted(packet(options_field(DISCOVER, tlv(80, b""), tlv(250, b"\x01\x02"))))
    assert msg.options[80] == b"" and msg.options[250] == b"\x01\x02"


def test_names_lose_trailing_nuls_only():
    msg = parse_untrusted(packet(options_field(DISCOVER), sname=b"a\0b", file=b"pxelinux.0"))
    assert (msg.sname, msg.file) == (b"a\0b", b"pxelinux.0")


BASE = packet(options_field(DISCOVER))
BAD_PACKETS = {
    "too-large": BASE + bytes(MAX_PACKET + 1 - len(BASE)),
    "too-short": BASE[:239],
    "bad-cookie": BASE[:236] + b"\0\0\0\0" + BASE[240:],  # BOOTP without DHCP: not served
    "bad-op": b"\x03" + BASE[1:],
    "bad-hlen": BASE[:2] + b"\x11" + BASE[3:],
    "truncated-option": packet(options_field(DISCOVER, b"\x0c\x05abc", end=b"")),
    "truncated-option/no length": packet(options_field(DISCOVER, b"\x0c", end=b"")),
    "truncated-option/in file": packet(
        options_field(DISCOVER, tlv(52, b"\x01")), file=bytes(120) + b"\x0c\x09abc"
    ),
    "truncated-option/in sname": packet(
        options_field(DISCOVER, tlv(52, b"\x02")), sname=bytes(63) + b"\x0c"
    ),
    "bad-overload/0": packet(options_field(DISCOVER, tlv(52, b"\x00"))),
    "bad-overload/4": packet(options_field(DISCOVER, tlv(52, b"\x04"))),
    "bad-overload/twice": packet(options_field(DISCOVER, tlv(52, b"\x01"), tlv(52, b"\x01"))),
    "bad-overload/empty": packet(options_field(DISCOVER, tlv(52, b""))),
    "bad-overload/nested": packet(
        options_field(DISCOVER, tlv(52, b"\x01")), file=tlv(52, b"\x02") + b"\xff"
    ),
    "bad-option-length/53": packet(options_field(tlv(53, b"\x01\x01"))),
    "bad-option-length/53 empty": packet(options_field(tlv(53, b""))),
    "bad-option-length/50": packet(options_field(DISCOVER, tlv(50, b"\x0a\x00\x00"))),
    "bad-option-length/54": packet(options_field(DISCOVER, tlv(54, bytes(5)))),
    "bad-option-length/57": packet(options_field(DISCOVER, tlv(57, b"\x05"))),
    "bad-option-length/61": packet(options_field(DISCOVER, tlv(61, b"\x01"))),
    "bad-option-length/93": packet(options_field(DISCOVER, tlv(93, b"\x00\x07\x00"))),
    "bad-option-length/118": packet(options_field(DISCOVER, tlv(118, b""))),
    "bad-option-length/repeat": packet(options_field(DISCOVER, tlv(53, b"\x01"))),
    "bad-message-type/0": packet(options_field(tlv(53, b"\x00"))),
    "bad-message-type/19": packet(options_field(tlv(53, b"\x13"))),
}


@pytest.mark.parametrize("case", BAD_PACKETS)
def test_every_bound_violation_is_malformed_with_its_reason(case):
    with pytest.raises(MalformedPacket) as info:
        parse_untrusted(BAD_PACKETS[case])
    assert info.value.reason == case.split("/")[0]
    assert str(info.value).startswith(info.value.reason)


def test_size_cap_comes_first():
    with pytest.raises(MalformedPacket, match="too-large"):
        parse_untrusted(b"\xff" * (MAX_PACKET + 1))
    assert parse_untrusted(BAD_PACKETS["too-large"][:MAX_PACKET]).message_type == 1


def test_accepts_bytearray_and_memoryview():
    assert (
        parse_untrusted(bytearray(BASE))
        == parse_untrusted(memoryview(BASE))
        == parse_untrusted(BASE)
    )


def option_codes(wire: bytes, start: int = 240) -> list[int]:
    codes, i = [], start
    while wire[i] != 255:
        codes.append(wire[i])
        i += 2 + wire[i + 1]
    return codes


def test_build_order_53_54_rest_82():
    msg = Message(
        op=2, options={12: b"h", 82: b"\x01\x02id", 54: bytes(4), 1: bytes(4), 53: b"\x02"}
    )
    assert option_codes(build(msg)) == [53, 54, 12, 1, 82]


def test_build_splits_long_options_into_255_byte_instances():
    wire = build(Message(options={53: b"\x05", 43: bytes(range(256)) * 2 + b"xyz"}), max_size=1500)
    assert option_codes(wire) == [53, 43, 43, 43]
    assert [wire[244], wire[244 + 257], wire[244 + 514]] == [255, 255, 5]  # lengths
    assert parse_untrusted(wire).options[43] == bytes(range(256)) * 2 + b"xyz"


def test_build_pads_to_300_and_honours_max_size():
    assert len(build(Message(options={53: b"\x01"}))) == 300
    big = {53: b"\x05", 43: bytes(200), 67: bytes(120), 66: bytes(60)}  # 389 bytes of options
    assert len(build(Message(options=big), max_size=1500)) == 240 + 389 + 1
    assert 52 in option_codes(build(Message(options=big)))  # 576: options field holds 307
    assert build(Message(options=big), max_size=100) == build(Message(options=big))  # 576 floor


def test_build_overloads_file_then_sname_when_they_are_free():
    options = {
        53: b"\x05",
        54: bytes(4),
        43: bytes(250),
        67: b"f" * 100,
        66: b"s" * 50,
        82: b"\x01\x01x",
    }
    wire = build(Message(op=2, options=options))
    assert len(wire) <= 548
    assert option_codes(wire) == [53, 54, 82, 43, 52]  # 82 stays where relays look for it
    assert wire[240 + 3 + 6 + 5 + 252 + 2] == 3  # overload: file and sname
    assert (option_codes(wire, 108), option_codes(wire, 44)) == ([67], [66])
    assert parse_untrusted(wire) == Message(op=2, options=options)


def test_build_uses_only_the_free_field():
    options = {53: b"\x05", 43: bytes(250), 66: b"s" * 50, 67: b"f" * 40}
    msg = Message(op=2, file=b"pxelinux.0", options=options)
    wire = build(msg)
    assert wire[108:119] == b"pxelinux.0\0" and wire[240 + 255 + 42 + 2] == 2  # sname only
    assert option_codes(wire) == [53, 43, 67, 52] and option_codes(wire, 44) == [66]
    assert parse_untrusted(wire) == msg
    msg.sname = b"tftp.rack"
    with pytest.raises(EncodeError, match="do not fit"):
        build(msg)


def test_build_moves_a_short_option_whole_and_splits_it_only_if_it_fits_nowhere():
    options = {53: b"\x05", 43: bytes(250), 67: b"f" * 120, 12: b"h" * 100}
    wire = build(Message(op=2, options=options))
    # main: 53, 43 and 47 bytes of 12; file: 67 whole, 3 bytes of 12; sname: the last 50
    assert option_codes(wire) == [53, 43, 12, 52]
    assert (option_codes(wire, 108), option_codes(wire, 44)) == ([67, 12], [12])
    assert parse_untrusted(wire).options == options


@pytest.mark.parametrize(
    "msg",
    [
        Message(options={0: b""}),
        Message(options={255: b""}),
        Message(options={52: b"\x01"}),  # overload is the codec's business
        Message(options={300: b""}),
        Message(options={12: "host"}),
        Message(options={53: b"\x01\x02"}),
        Message(options={53: b"\x00"}),
        Message(options={50: b"\x0a\x00\x00"}),
        Message(options={61: b"\x01"}),
        Message(op=0),
        Message(hlen=17),
        Message(xid=2**32),
        Message(secs=-1),
        Message(ciaddr="10.0.0.1"),
        Message(chaddr=bytes(17)),
        Message(sname=b"s" * 65),
        Message(file=b"f" * 129),
    ],
    ids=repr,
)
def test_build_refuses_what_a_parser_would_reject(msg):
    with pytest.raises(EncodeError):
        build(msg)


def test_accessors_on_a_built_request():
    msg = Message(
        htype=32,  # InfiniBand: no MAC string
        hlen=0,
        flags=0x8000,
        options={
            53: b"\x03",
            50: bytes([10, 0, 0, 7]),
            54: bytes([10, 0, 0, 1]),
            51: (3600).to_bytes(4, "big"),
            118: bytes([192, 0, 2, 0]),
            82: b"\x01\x04port",
            77: b"\x04iPXE",
            93: b"\x00\x07\x00\x10",
        },
    )
    msg = parse_untrusted(build(msg))
    assert msg.broadcast and msg.mac is None and msg.message_type is MessageType.REQUEST
    assert (msg.requested_ip, msg.server_id) == (IPv4Address("10.0.0.7"), IPv4Address("10.0.0.1"))
    assert msg.subnet_selection == IPv4Address("192.0.2.0") and msg.lease_time == 3600
    assert msg.relay_agent_info == b"\x01\x04port" and msg.user_classes == [b"iPXE"]
    assert msg.client_arches == [7, 16] and msg.hostname is None and msg.vendor_class is None
    assert Message().message_type is None and Message().parameter_request_list == []


def test_codec_is_sans_io():
    from tests.unit.test_architecture import violations

    assert violations("plugins.dhcp.codec") == []
