"""Replies as frames through a packet socket, as ISC dhcrelay sends them: broadcasts,
and unicasts to a client without an address (to its MAC, with no ARP entry).

One ``AF_PACKET``/``SOCK_DGRAM`` socket of protocol 0 (it receives nothing) sends the
IPv4 + UDP packets frames.py builds to ff:ff:ff:ff:ff:ff, or the client's MAC, on an
interface named at each send; the kernel writes the Ethernet header from the
interface's MAC of that moment (and a VLAN's tag). An interface deleted and made
again under its name is the new one at the next send. It needs CAP_NET_RAW and an
Ethernet interface; without either, and for any packet the socket refuses (longer
than the MTU, the link down, the interface gone, a full queue), the caller sends by
``sendmsg`` as before (an ARP entry first for a unicast), which the kernel fragments
or fails and counts.
"""

from __future__ import annotations

import fcntl
import socket
import struct

from appliance.logs import get_logger

from .frames import LIMITED_BROADCAST, ReplyPackets

log = get_logger("relay")

ETH_P_IP = 0x0800
ARPHRD_ETHER = 1
SIOCGIFHWADDR = 0x8927
BROADCAST_MAC = b"\xff" * 6


def open_packet_socket() -> socket.socket | None:
    """The sending socket; None without CAP_NET_RAW (logged)."""
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0)
    except OSError as exc:
        log.info("replies through sendmsg", reason=str(exc))
        return None
    sock.setblocking(False)
    return sock


def hardware_type(name: str) -> int | None:
    """The interface's ARPHRD_* type, None if there is no such interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            ifreq = fcntl.ioctl(
                sock.fileno(), SIOCGIFHWADDR, struct.pack("256s", name.encode()[:15])
            )
        except OSError:
            return None
    return struct.unpack_from("=H", ifreq, 16)[0]  # ifr_hwaddr.sa_family


class FrameLinks:
    """Which client-facing interfaces send replies through the packet socket, and how."""

    def __init__(self, sock: socket.socket | None, source_port: int, port: int) -> None:
        self.sock = sock
        self.source_port, self.port = source_port, port
        # interface -> its packet maker and the socket address of its broadcasts
        self._links: dict[str, tuple[ReplyPackets, tuple]] = {}
        self.refused = 0  # packets the socket refused (sent by sendmsg instead)

    def learn(self, name: str, address: int) -> None:
        """Interface ``name`` (made again, perhaps) sends from ``address``."""
        self._links.pop(name, None)
        kind = hardware_type(name)
        if self.sock is None or kind != ARPHRD_ETHER:
            if self.sock is not None:
                log.info("replies through sendmsg", interface=name,
                         reason=f"hardware type {kind}, not Ethernet")  # fmt: skip
            return
        packets = ReplyPackets(address, self.source_port, self.port)
        self._links[name] = (packets, (name, ETH_P_IP, 0, 0, BROADCAST_MAC))

    def uses_frames(self, name: str) -> bool:
        return name in self._links

    def send(self, name: str, payload: bytes, address: bytes = LIMITED_BROADCAST,
             mac: bytes | None = None) -> bool:  # fmt: skip
        """``payload`` as a frame on ``name``: broadcast, or to ``address`` (4 bytes) at
        ``mac``. False: send it another way."""
        link = self._links.get(name)
        if link is None:
            return False
        assert self.sock is not None
        packets, broadcast = link
        to = broadcast if mac is None else (name, ETH_P_IP, 0, 0, mac)
        try:
            self.sock.sendto(packets.packet(payload, address), to)
        except OSError as exc:
            self.refused += 1
            log.debug("frame refused", interface=name, error=str(exc))
            return False
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
