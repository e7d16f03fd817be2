"""The probe on the wire (the shell of :mod:`plugins.dhcp.probe`): scapy's ``AF_PACKET``
socket on one interface sends the DISCOVER from the throw-away MAC (our source MAC
is no interface's, which only a link-layer socket can do) and reads every frame
until the deadline. scapy is imported here only, when a probe runs: never at
start-up (``import scapy`` costs a second and ~95 MB).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time

from .probe import ProbeCollector, discover, throwaway_mac

RESEND_AFTER = 1.0  # a second DISCOVER (same transaction) in case the first was lost
MAX_FRAMES = 200_000  # read per probe at most, whatever the link's traffic
DHCP_CLIENT_PORT = 68


class ProbeError(Exception):
    """The probe could not run: the text says why and what to do."""


def _to_client_port(frame: bytes) -> bool:
    """Cheap test before scapy decodes: IPv4, UDP, to port 68 (most frames are not)."""
    if len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
        return False
    ihl = (frame[14] & 0x0F) * 4
    return len(frame) >= 14 + ihl + 8 and struct.unpack_from("!H", frame, 16 + ihl)[0] == 68


def run_probe(interface: str, timeout: float) -> ProbeCollector:
    try:
        socket.if_nametoindex(interface)
    except OSError:
        raise ProbeError(f"no interface named {interface!r} here (see `ip link`)") from None
    try:
        from scapy.config import conf
        from scapy.layers.inet import IP, UDP
        from scapy.layers.l2 import Ether
        from scapy.packet import Raw
    except ImportError:
        raise ProbeError(
            "the probe needs scapy: pip install 'rackboot[diag]' (or apt install python3-scapy)"
        ) from None
    mac, xid = throwaway_mac(os.urandom(6)), int.from_bytes(os.urandom(4), "big")
    collector = ProbeCollector(mac, xid, time.monotonic())

    def frame(secs: int) -> bytes:
        return bytes(
            Ether(src=mac.hex(":"), dst="ff:ff:ff:ff:ff:ff")
            / IP(src="0.0.0.0", dst="255.255.255.255")
            / UDP(sport=DHCP_CLIENT_PORT, dport=67)
            / Raw(discover(mac, xid, secs))
        )

    try:
        # promisc: a server that ignores the broadcast flag sends to our MAC, which no
        # interface has; the membership is the socket's and goes with it
        sock = conf.L2socket(iface=interface, promisc=True)
    except PermissionError:
        raise ProbeError("the probe needs root (CAP_NET_RAW) for a link-layer socket") from None
    except (OSError, ValueError) as exc:  # scapy says ValueError for an interface gone
        raise ProbeError(
            f"cannot open {interface!r}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    try:
        _listen(sock, collector, frame, timeout)
    finally:
        sock.close()
    return collector


def _listen(sock, collector: ProbeCollector, frame, timeout: float) -> None:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    start = collector.started
    deadline = start + timeout
    resend = start + RESEND_AFTER if timeout > 2 * RESEND_AFTER else None
    try:
        sock.send(frame(0))
    except OSError as exc:
        raise ProbeError(f"cannot send on the interface: {exc.strerror or exc}") from None
    for _ in range(MAX_FRAMES):
        now = time.monotonic()
        if now >= deadline:
            return
        if resend is not None and now >= resend:
            sock.send(frame(int(now - start)))
            resend = None
        wait = min(deadline, resend or deadline) - now
        if not select.select([sock.ins], [], [], max(0.0, wait))[0]:
            continue
        _, data, _ = sock.recv_raw()
        if data is None or not _to_client_port(data):
            continue
        packet = Ether(data)
        if IP in packet and UDP in packet:
            collector.receive_untrusted(bytes(packet[UDP].payload), packet[IP].src,
                                        packet[Ether].src, time.monotonic())  # fmt: skip
