"""The TFTP packet codec: round trips, malformed input, fuzzing."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.tftp.packets import (
    MAX_PACKET,
    Ack,
    Data,
    Error,
    ErrorCode,
    MalformedPacket,
    Opcode,
    OptionAck,
    Request,
    encode_ack,
    encode_data,
    encode_error,
    encode_oack,
    encode_request,
    parse_untrusted,
)

ascii_text = st.text(st.characters(min_codepoint=1, max_codepoint=127), max_size=20)
names = st.text(st.characters(min_codepoint=1, max_codepoint=127), min_size=1, max_size=10)
options = st.dictionaries(names.map(str.lower), ascii_text, max_size=4)
blocks = st.integers(0, 0xFFFF)


@given(
    st.sampled_from([Opcode.RRQ, Opcode.WRQ]),
    st.binary(max_size=60).map(lambda b: b.replace(b"\0", b"")),
    st.sampled_from(["octet", "netascii", "mail"]),
    options,
)
def test_request_round_trip(opcode, raw_name, mode, opts):
    name = os.fsdecode(raw_name)
    packet = parse_untrusted(encode_request(opcode, name, mode, opts))
    assert packet == Request(opcode, name, mode, opts)
    assert os.fsencode(packet.filename) == raw_name


@given(blocks, st.binary(max_size=2000))
def test_data_round_trip(block, payload):
    assert parse_untrusted(encode_data(block, payload)) == Data(block, payload)


@given(blocks)
def test_ack_round_trip(block):
    assert parse_untrusted(encode_ack(block)) == Ack(block)


@given(blocks, ascii_text)
def test_error_round_trip(code, message):
    assert parse_untrusted(encode_error(code, message)) == Error(code, message)


@given(options.filter(bool))
def test_oack_round_trip(opts):
    assert parse_untrusted(encode_oack(opts)) == OptionAck(opts)


def test_mode_and_option_names_are_case_insensitive():
    packet = parse_untrusted(b"\0\x01pxelinux.0\0OcTeT\0BlkSize\x001468\0TSIZE\x000\0")
    assert packet == Request(Opcode.RRQ, "pxelinux.0", "octet", {"blksize": "1468", "tsize": "0"})
    assert list(packet.options) == ["blksize", "tsize"]


def test_non_ascii_file_name_maps_back_to_its_bytes():
    packet = parse_untrusted(b"\0\x01boot/\xff\xfe\xc3\xa9\0octet\0")
    assert os.fsencode(packet.filename) == b"boot/\xff\xfe\xc3\xa9"
    assert encode_error(1, f"{packet.filename}: file not found").endswith(b"not found\0")


def test_unknown_and_empty_modes_parse_for_the_shell_to_refuse():
    assert parse_untrusted(b"\0\x01f\0\0").mode == ""
    assert parse_untrusted(b"\0\x02f\0MAIL\0") == Request(Opcode.WRQ, "f", "mail", {})


def test_trailing_nul_padding_after_the_mode_is_no_options():
    assert parse_untrusted(b"\0\x01f\0octet\0\0\0\0").options == {}


def test_ack_with_trailing_bytes_is_accepted_like_tftpd_hpa():
    assert parse_untrusted(b"\0\x04\0\x07junk") == Ack(7)


def test_error_without_terminator_and_unknown_code():
    assert parse_untrusted(b"\0\x05\0\x63oops") == Error(99, "oops")
    assert parse_untrusted(b"\0\x05\0\x08\xffbad\0") == Error(8, "\ufffdbad")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\0",
        b"\0\x04\0",  # ACK too short
        b"\0\x00\0\0",  # opcode 0
        b"\0\x07\0\0",  # opcode 7
        b"\xff\xff\0\0",
        b"\0\x01file\0octet",  # mode not terminated
        b"\0\x01file\0",  # no mode
        b"\0\x01file\0oct\xe9t\0",  # non-ASCII mode
        b"\0\x01f\0octet\0blksize\0",  # option without value
        b"\0\x01f\0octet\0blksize\x00512\0BLKSIZE\x00512\0",  # duplicate option
        b"\0\x01f\0octet\0\0512\0",  # empty option name
        b"\0\x01f\0octet\0blksize\0\xff\0",  # non-ASCII value
        b"\0\x01" + b"a" * 600 + b"\0octet\0",  # request above 512 octets
        b"\0\x06blksize\x00512",  # OACK value not terminated
        b"\0\x06blksize\0",  # OACK odd
        encode_data(1, bytes(MAX_PACKET - 3)),  # one byte above the largest DATA
    ],
)
def test_malformed(data):
    with pytest.raises(MalformedPacket):
        parse_untrusted(data)


def test_largest_data_packet_parses():
    assert len(parse_untrusted(encode_data(1, bytes(MAX_PACKET - 4))).payload) == 65464


def test_encoders_refuse_nul_inside_strings():
    with pytest.raises(ValueError):
        encode_oack({"blksize": "5\x0012"})
    with pytest.raises(ValueError):
        encode_request(Opcode.DATA, "f")
    assert encode_error(ErrorCode.FILE_NOT_FOUND, "a\0b") == b"\0\x05\0\x01ab\0"


@given(st.binary(max_size=700))
def test_fuzz_arbitrary_bytes_raise_only_malformed(data):
    try:
        parse_untrusted(data)
    except MalformedPacket:
        pass


@given(st.integers(0, 8), st.lists(st.sampled_from([b"\0", b"a", b"\xff", b"blksize", b"0"])))
def test_fuzz_plausible_packets_raise_only_malformed(opcode, pieces):
    try:
        parse_untrusted(struct.pack("!H", opcode) + b"".join(pieces))
    except MalformedPacket:
        pass
