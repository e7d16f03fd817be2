"""Linux socket plumbing for DHCP: per-interface sockets, arrival addresses,
L2 delivery to clients without an address, and the ICMP conflict probe."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct

import trio

SIOCSARP = 0x8955
SIOCDARP = 0x8953
ATF_COM = 0x02
ARPHRD_ETHER = 1
_PKTINFO = struct.Struct("=I4s4s")  # struct in_pktinfo: ifindex, spec_dst, addr
CMSG_SPACE = socket.CMSG_SPACE(_PKTINFO.size)
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)  # Linux; the constant arrived in Python 3.12
SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)
SO_DETACH_FILTER = getattr(socket, "SO_DETACH_FILTER", 27)
# A classic BPF program of one instruction, BPF_RET|BPF_K with k = 0: keep 0 bytes of
# every datagram, that is drop it (struct sock_filter: code, jt, jf, k).
_DROP_ALL = struct.pack("=HBBI", 0x06, 0, 0, 0)


def open_server_socket(interface: str | None, port: int) -> socket.socket:
    """A non-blocking UDP socket on ``0.0.0.0:port`` that sees only ``interface`` (every
    interface for None: the relay tells them apart by ``IP_PKTINFO``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        try:
            if interface is not None:
                sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, interface.encode())
            address = "0.0.0.0"
        except PermissionError:
            if interface != "lo":
                raise
            address = "127.0.0.1"  # an unprivileged development node: loopback only
        sock.bind((address, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def set_deaf(sock: socket.socket, deaf: bool) -> None:
    """Deaf: the kernel drops every datagram for ``sock`` before it is queued (a socket
    filter), so the process is not woken for it; a standby with nothing to answer drops
    every broadcast of a busy rack anyway. Undone at once when it is to answer again."""
    if deaf:
        program = ctypes.create_string_buffer(_DROP_ALL, len(_DROP_ALL))
        # struct sock_fprog: the instruction count, then a pointer (the kernel copies it)
        fprog = struct.pack("HP", 1, ctypes.addressof(program))
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # no filter attached: already hearing
            raise


def arrival_address(ancdata: list[tuple[int, int, bytes]]) -> tuple[int, int] | None:
    """(ifindex, our address on it) from ``IP_PKTINFO``, or None if absent."""
    for level, kind, data in ancdata:
        if level == socket.IPPROTO_IP and kind == IP_PKTINFO and len(data) >= _PKTINFO.size:
            ifindex, spec_dst, _ = _PKTINFO.unpack_from(data)
            return ifindex, int.from_bytes(spec_dst, "big")
    return None


def source_cmsg(source: int, ifindex: int = 0) -> tuple[int, int, bytes]:
    """The ``IP_PKTINFO`` ancillary item of a ``sendmsg`` that leaves from ``source`` (the
    rack's VIP): the kernel takes ``ipi_spec_dst`` as the source address. It must be an
    address of this host, else the send fails (EINVAL); the interface stays the socket's,
    or is ``ifindex`` when given (a broadcast then leaves through that interface)."""
    spec = source.to_bytes(4, "big")
    return socket.IPPROTO_IP, IP_PKTINFO, _PKTINFO.pack(ifindex, spec, bytes(4))


def interface_address(interface: str) -> int:
    """The interface's primary IPv4 address (0 if it has none), via SIOCGIFADDR."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            result = fcntl.ioctl(
                sock.fileno(), 0x8915, struct.pack("256s", interface.encode()[:15])
            )
        except OSError:
            return 0
    return int.from_bytes(result[20:24], "big")


def _arp_request(interface: str, address: str, hwaddr: bytes) -> bytes:
    """A ``struct arpreq`` for the SIOC*ARP ioctls."""
    protocol = struct.pack("=H2s4s8s", socket.AF_INET, b"\0\0", socket.inet_aton(address), b"")
    hardware = struct.pack("=H14s", ARPHRD_ETHER, hwaddr)
    flags = struct.pack("=i", ATF_COM)
    return protocol + hardware + flags + bytes(16) + interface.encode()[:15].ljust(16, b"\0")


def delete_arp_entry(sock: socket.socket, interface: str, address: str) -> None:
    """Forget the entry :func:`set_arp_entry` made once its reply has left. Kept, it
    would stay ~8 s (the kernel probes the MAC it names before dropping it), and the
    neighbour table, shared by every namespace of the host (1024 entries by default),
    holds ~128 new clients a second: a DISCOVER storm evicted the host's other entries.
    The client resolves its server by ARP itself once it has its address."""
    try:
        fcntl.ioctl(sock.fileno(), SIOCDARP, _arp_request(interface, address, bytes(6)))
    except (OSError, ValueError):  # gone already, or the socket closed: nothing to forget
        pass


def set_arp_entry(sock: socket.socket, interface: str, address: str, hwaddr: bytes) -> bool:
    """Tell the kernel ``address`` is at ``hwaddr`` so a unicast reaches a client
    that has no address yet (what dnsmasq does).

    False when this can never work here: no CAP_NET_ADMIN, or an interface that
    takes no ARP entries. Raises ``OSError`` for a refusal that may pass, above
    all ENOBUFS: the kernel's neighbour table (one for all namespaces, 1024
    entries by default) is full and entries younger than 5 s cannot be evicted,
    as after a DISCOVER storm from many MACs."""
    try:
        fcntl.ioctl(sock.fileno(), SIOCSARP, _arp_request(interface, address, hwaddr))
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENODEV):
            return False
        raise
    return True


async def icmp_in_use(address: str, timeout: float) -> bool:
    """Does anything answer an ICMP echo to ``address`` within ``timeout``?"""
    try:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
        raw = False
    except OSError:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        raw = True
    ident = os.getpid() & 0xFFFF
    with sock:
        echo = _icmp_echo(ident, 1)
        await sock.sendto(echo, (address, 0))
        with trio.move_on_after(timeout):
            while True:
                data, (source, _) = await sock.recvfrom(1500)
                if raw:
                    data = data[(data[0] & 0x0F) * 4 :]
                if source == address and data[:1] == b"\x00":  # echo reply
                    return True
    return False


def _icmp_echo(ident: int, sequence: int) -> bytes:
    header = struct.pack("!BBHHH", 8, 0, 0, ident, sequence) + b"rackboot-probe"
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    total = (total >> 16) + (total & 0xFFFF)
    checksum = ~(total + (total >> 16)) & 0xFFFF
    return header[:2] + struct.pack("!H", checksum) + header[4:]
