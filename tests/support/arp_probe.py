"""Ask who has an address, every few milliseconds, and record who answers (standard library only).

Run inside a lab namespace (``python arp_probe.py IFACE SOURCE_IP TARGET_IP SECONDS
INTERVAL``): it broadcasts an ARP request for TARGET_IP from SOURCE_IP every
INTERVAL seconds for SECONDS seconds, and prints one line per reply,
``<CLOCK_MONOTONIC seconds> <sender MAC>``, flushed at once, so a test can
tell exactly when each machine answered for a virtual IP. The monotonic clock
is the whole machine's, so the test's own timestamps compare with these.
"""

from __future__ import annotations

import select
import socket
import struct
import sys
import time

ETH_P_ARP = 0x0806


def request(mac: bytes, source: str, target: str) -> bytes:
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, socket.inet_aton(source),
                      b"\x00" * 6, socket.inet_aton(target))  # fmt: skip
    return b"\xff" * 6 + mac + struct.pack("!H", ETH_P_ARP) + arp


def reply_from(frame: bytes, target: bytes) -> str | None:
    """The sender MAC of an ARP reply for ``target``, else None."""
    if len(frame) < 42 or frame[12:14] != b"\x08\x06":
        return None
    op, sha, spa = struct.unpack("!H6s4s", frame[20:32])
    if op != 2 or spa != target:
        return None
    return sha.hex(":")


def main(interface: str, source: str, target: str, seconds: float, interval: float) -> None:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP))
    sock.bind((interface, ETH_P_ARP))
    mac = sock.getsockname()[4][:6]
    frame, wanted = request(mac, source, target), socket.inet_aton(target)
    end = time.monotonic() + seconds
    next_send = time.monotonic()
    while (now := time.monotonic()) < end:
        if now >= next_send:
            sock.send(frame)
            next_send = now + interval
        readable, _, _ = select.select([sock], [], [], max(0.0, min(next_send, end) - now))
        if readable:
            who = reply_from(sock.recv(128), wanted)
            if who is not None:
                print(f"{time.monotonic():.6f} {who}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]))
