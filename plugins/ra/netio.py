"""Linux plumbing for neighbour discovery: a raw ICMPv6 socket per interface that hears
router solicitations and advertisements only, and what the kernel knows of the
interface (its link-local address, its MAC, whether it is a loopback)."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from plugins.dhcp.netio import SO_BINDTODEVICE

from .ndp import ALL_ROUTERS, HOP_LIMIT, RA, RS

ICMP6_FILTER = 1  # <netinet/icmp6.h>, level IPPROTO_ICMPV6; not in Python's socket module
IFA_F_DADFAILED, IFA_F_TENTATIVE = 0x08, 0x40
ARPHRD_LOOPBACK = 772
_HOPLIMIT_SPACE = socket.CMSG_SPACE(4)
_PKTINFO6 = struct.Struct("=16sI")  # struct in6_pktinfo: address, interface index


def _icmp6_filter(*passed: int) -> bytes:
    """struct icmp6_filter: 256 bits, a set bit blocks that type (ICMP6_FILTER_SETPASS)."""
    words = [0xFFFFFFFF] * 8
    for kind in passed:
        words[kind >> 5] &= ~(1 << (kind & 31))
    return struct.pack("=8I", *words)


def open_ndp_socket(interface: str, ifindex: int) -> socket.socket:
    """A non-blocking raw ICMPv6 socket on ``interface``: RS and RA only (the kernel
    checks their checksum), the hop limit of each reported, 255 on what it sends,
    joined to the all-routers group (a host's kernel does not accept ff02::2)."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, interface.encode())
        sock.setsockopt(socket.IPPROTO_ICMPV6, ICMP6_FILTER, _icmp6_filter(RS, RA))
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, HOP_LIMIT)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, HOP_LIMIT)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, ifindex)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 0)  # not our own
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP,
                        ALL_ROUTERS + struct.pack("=I", ifindex))  # fmt: skip
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def receive(sock: socket.socket) -> tuple[bytes, bytes, int | None]:
    """(ICMPv6 message, source address, IP hop limit); BlockingIOError when empty."""
    data, ancdata, _flags, address = sock.recvmsg(2048, _HOPLIMIT_SPACE)
    hop_limit = None
    for level, kind, value in ancdata:
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_HOPLIMIT and len(value) >= 4:
            hop_limit = struct.unpack_from("=i", value)[0]  # an int, in host byte order
    return data, socket.inet_pton(socket.AF_INET6, address[0].partition("%")[0]), hop_limit


def send(sock: socket.socket, payload: bytes, destination: bytes, ifindex: int,
         source: bytes) -> None:  # fmt: skip
    """Send from our link-local ``source`` (RFC 4861: an RA's source is link-local; the
    kernel might pick another address)."""
    pktinfo = (socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, _PKTINFO6.pack(source, ifindex))
    target = (socket.inet_ntop(socket.AF_INET6, destination), 0, 0, ifindex)
    sock.sendmsg([payload], [pktinfo], 0, target)


def link_local(interface: str, proc: Path = Path("/proc/net/if_inet6")) -> bytes | None:
    """The interface's usable link-local address (not tentative, not failed DAD), or None."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None  # IPv6 off in this kernel
    for line in lines:
        fields = line.split()
        if len(fields) != 6 or fields[5] != interface or int(fields[3], 16) != 0x20:
            continue  # 0x20: link scope
        if int(fields[4], 16) & (IFA_F_TENTATIVE | IFA_F_DADFAILED):
            continue
        return bytes.fromhex(fields[0])
    return None


def hardware_address(interface: str, sys: Path = Path("/sys/class/net")) -> bytes | None:
    try:
        text = (sys / interface / "address").read_text().strip()
        mac = bytes.fromhex(text.replace(":", ""))
    except (OSError, ValueError):
        return None
    return mac if len(mac) == 6 else None  # an Ethernet address; others go without


def is_loopback(interface: str, sys: Path = Path("/sys/class/net")) -> bool:
    try:
        return int((sys / interface / "type").read_text()) == ARPHRD_LOOPBACK
    except (OSError, ValueError):
        return interface == "lo"
