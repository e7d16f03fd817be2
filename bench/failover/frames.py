"""Ethernet/IPv4/UDP frames as an ``AF_PACKET`` socket returns them, decoded just enough
to tell which appliance sent a DHCP reply (its Ethernet source) and where it went."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
PACKET_OUTGOING = 4


@dataclass(frozen=True)
class Udp:
    src_mac: str
    dst_mac: str
    src: str
    dst: str
    sport: int
    dport: int
    payload: bytes
    outgoing: bool  # a frame this namespace sent


def udp_of(frame: bytes, address: tuple) -> Udp | None:
    """The UDP datagram a frame carries (first fragment only), or None."""
    if len(frame) < 14 + 20 + 8 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    if ip[9] != socket.IPPROTO_UDP or len(ip) < ihl + 8:
        return None
    sport, dport, length = struct.unpack_from("!HHH", ip, ihl)
    return Udp(
        src_mac=frame[6:12].hex(":"),
        dst_mac=frame[0:6].hex(":"),
        src=socket.inet_ntoa(ip[12:16]),
        dst=socket.inet_ntoa(ip[16:20]),
        sport=sport,
        dport=dport,
        payload=bytes(ip[ihl + 8 : ihl + length]),
        outgoing=address[2] == PACKET_OUTGOING,
    )
