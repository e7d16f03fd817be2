"""IPv4 + UDP packets for the replies the relay sends as frames on a client link, sans-IO.

Sent through a packet socket (linklayer.py), a broadcast reply skips the kernel's IP
output path and the copy of every broadcast the kernel loops back to local sockets,
which made a broadcast ``sendmsg`` cost more than an upstream ``sendto``; a reply to
a client without an address goes to its MAC without an ARP entry (ISC dhcrelay sends
its replies as frames too). The kernel adds the Ethernet header, from the
interface's MAC as it is at the time of sending. Bytes in, a packet out.
"""

from __future__ import annotations

import struct

# IPv4 header (version 4, 20 bytes; TOS; total length; id; flags; TTL; protocol;
# checksum; addresses), then the UDP header (ports, length, checksum)
_HEADERS = struct.Struct("!BBHHHBBH4s4sHHHH")
VERSION_IHL = 0x45
DONT_FRAGMENT = 0x4000  # as the kernel sends UDP (path MTU discovery); id 0, RFC 6864
TTL = 64  # the kernel's default for the relay's other datagrams
UDP = 17
LIMITED_BROADCAST = b"\xff\xff\xff\xff"


def word_sum(data: bytes) -> int:
    """A number congruent, modulo 0xFFFF, to the sum of ``data``'s 16-bit big-endian
    words (odd: padded with a zero byte): 2**16 is 1 modulo 0xFFFF, so the number the
    bytes spell is. Partial sums may be added before :func:`fold`."""
    number = int.from_bytes(data, "big")
    return (number << 8 if len(data) & 1 else number) % 0xFFFF


def fold(total: int) -> int:
    """The ones' complement sum (RFC 1071) whose words add up to ``total`` > 0: the value
    in 1..0xFFFF congruent to it modulo 0xFFFF (end-around carries keep it nonzero)."""
    return (total - 1) % 0xFFFF + 1


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``, which has a nonzero word."""
    return 0xFFFF - fold(word_sum(data))


class ReplyPackets:
    """Packets from one interface's address and ``source_port`` to ``port`` at
    255.255.255.255 or a client's address: what does not depend on the payload is
    summed once."""

    def __init__(self, source: int, source_port: int, port: int) -> None:
        self.source = source.to_bytes(4, "big")
        self.source_port, self.port = source_port, port
        source_words = word_sum(self.source)
        # IPv4 header words but the destination, total length and checksum (id is 0)
        self._ip_words = (VERSION_IHL << 8) + DONT_FRAGMENT + (TTL << 8 | UDP) + source_words
        # UDP: the pseudo-header (but the destination; its length is added per packet,
        # as is the header's own) and the ports
        self._udp_words = source_words + UDP + source_port + port

    def packet(self, payload: bytes, destination: bytes = LIMITED_BROADCAST) -> bytes:
        """``payload`` to ``destination`` (4 bytes)."""
        udp_length = 8 + len(payload)
        length = 20 + udp_length
        to = word_sum(destination)
        ip_sum = 0xFFFF - fold(self._ip_words + to + length)
        # 0 means "no checksum" in UDP over IPv4: a computed 0 is sent as 0xFFFF
        udp_sum = 0xFFFF - fold(self._udp_words + to + 2 * udp_length + word_sum(payload)) or 0xFFFF
        return _HEADERS.pack(VERSION_IHL, 0, length, 0, DONT_FRAGMENT, TTL, UDP, ip_sum,
                             self.source, destination, self.source_port, self.port,
                             udp_length, udp_sum) + payload  # fmt: skip
