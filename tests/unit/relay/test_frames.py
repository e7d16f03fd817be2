"""The reply packets of plugins/relay/frames.py against scapy's IP/UDP (the oracle:
never imported by the product), which computes lengths and checksums itself, and the
checksum's edge cases against RFC 1071's loop with end-around carries."""

from __future__ import annotations

import random
from ipaddress import IPv4Address

import pytest

from plugins.relay.frames import ReplyPackets, checksum

inet = pytest.importorskip("scapy.layers.inet")

SOURCE = "10.1.7.1"


def oracle(payload: bytes, source: str = SOURCE, sport: int = 67, dport: int = 68,
           destination: str = "255.255.255.255") -> bytes:  # fmt: skip
    packet = (
        inet.IP(src=source, dst=destination, ttl=64, flags="DF", id=0)
        / inet.UDP(sport=sport, dport=dport)
        / payload
    )
    return bytes(packet)


def packets(source: str = SOURCE, sport: int = 67, dport: int = 68) -> ReplyPackets:
    return ReplyPackets(int(IPv4Address(source)), sport, dport)


def rfc1071(data: bytes) -> int:
    """RFC 1071 §4.1's loop: 16-bit words added, carries folded back, complemented."""
    if len(data) & 1:
        data += b"\0"
    total = 0
    for i in range(0, len(data), 2):
        total += data[i] << 8 | data[i + 1]
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@pytest.mark.parametrize("size", [0, 1, 241, 300, 548, 575, 1472, 4096])
def test_packet_is_scapys(size: int) -> None:
    rng = random.Random(size)
    for _ in range(50):
        payload = rng.randbytes(size)
        assert packets().packet(payload) == oracle(payload)


def test_a_unicast_packet_is_scapys() -> None:
    rng = random.Random(2131)
    for _ in range(200):
        client = str(IPv4Address(rng.getrandbits(32)))
        payload = rng.randbytes(rng.randrange(240, 600))
        packet = packets().packet(payload, IPv4Address(client).packed)
        assert packet == oracle(payload, destination=client), client


def test_ports_and_source_are_the_configured_ones() -> None:
    packet = packets("192.168.200.254", 1067, 1068).packet(b"\x02" * 300)
    assert packet == oracle(b"\x02" * 300, "192.168.200.254", 1067, 1068)
    parsed = inet.IP(packet)
    assert (parsed.src, parsed.dst) == ("192.168.200.254", "255.255.255.255")
    assert (parsed[inet.UDP].sport, parsed[inet.UDP].dport) == (1067, 1068)


def test_a_udp_checksum_of_zero_is_sent_as_ffff() -> None:
    """A payload that brings the sum to 0xFFFF would make the checksum 0 ("none")."""
    base = packets().packet(b"\x00\x00")
    current = int.from_bytes(base[26:28], "big")  # the UDP checksum over a zero payload
    payload = current.to_bytes(2, "big")  # adds exactly what was missing to 0xFFFF
    packet = packets().packet(payload)
    assert packet[26:28] == b"\xff\xff"
    assert packet == oracle(payload)


def test_an_ip_header_whose_words_sum_to_ffff_has_checksum_zero() -> None:
    """The one case a modulo-0xFFFF sum tells apart from 0: the header checksum is 0,
    not 0xFFFF (both verify, but RFC 1071 and every stack compute 0)."""
    payload = bytes(300)
    # the header's words with the source's last word 0 and no checksum: the last word
    # that brings their ones' complement sum to 0xFFFF
    header = bytearray(oracle(payload, "10.1.0.0")[:20])
    header[10:12] = b"\0\0"
    last = 0xFFFF - (~rfc1071(bytes(header)) & 0xFFFF)
    source = f"10.1.{last >> 8}.{last & 0xFF}"
    expected = oracle(payload, source)
    assert expected[10:12] == b"\x00\x00" and rfc1071(expected[:20]) == 0
    assert packets(source).packet(payload) == expected


def test_checksum_is_rfc1071s() -> None:
    """RFC 1071 §3's example words sum to 0xDDF2; random data as the RFC's loop does."""
    assert checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0xFFFF - 0xDDF2
    rng = random.Random(1071)
    for size in [1, 2, 3, 20, 21, 300]:
        for _ in range(200):
            data = rng.randbytes(size)
            if any(data):
                assert checksum(data) == rfc1071(data), data.hex()
    assert checksum(b"\xff\xff") == 0 == rfc1071(b"\xff\xff")
