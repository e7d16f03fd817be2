"""The client-side probe: a full DORA every 50 ms, relay-style, in the probe namespace.

``python -m bench.failover.probe GIADDR IFNAME OUT [PERIOD]`` sends each exchange's
messages to 255.255.255.255:67 with ``giaddr`` set (replies come back to
GIADDR:67), rotating through 8 client MACs, and appends one JSON line per
OFFER and ACK to OUT: ``{"t": monotonic, "type", "server", "xid", "mac",
"src"}``. ``CLOCK_MONOTONIC`` is one clock for every namespace of the host,
so the controller compares these times with its own kill times.

With ``[ha] vip`` both appliances answer with the VIP as server identifier
and reply source, so neither tells them apart: ``mac`` is the Ethernet
source of the frame that carried the reply, read from an ``AF_PACKET``
socket on IFNAME (the reply is taken from there; the UDP socket bound to
GIADDR:67 is drained so the kernel has a listener and sends no ICMP).
PERIOD (seconds, default 0.05) is the time between DISCOVERs. Runs until SIGTERM.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time

from bench.dhcp.probe import ACK, DISCOVER, OFFER, REQUEST, build, parse
from bench.failover.frames import ETH_P_IP, udp_of

PERIOD = 0.05
MACS = [bytes([2, 0xFA, 0, 0, 0, i]) for i in range(8)]


def main(argv: list[str]) -> int:
    giaddr, ifname, out_path = argv[0], argv[1], argv[2]
    period = float(argv[3]) if len(argv) > 3 else PERIOD
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.bind((giaddr, 67))
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
    raw.bind((ifname, 0))
    gi = socket.inet_aton(giaddr)
    pending: dict[int, bytes] = {}  # xid -> mac of exchanges waiting for an OFFER
    xid = int.from_bytes(os.urandom(3), "big") << 8
    next_send = time.monotonic()
    n = 0
    with open(out_path, "a", buffering=1) as out:
        while True:
            now = time.monotonic()
            if now >= next_send:
                xid += 1
                mac = MACS[n % len(MACS)]
                n += 1
                pending[xid] = mac
                if len(pending) > 64:
                    pending.pop(next(iter(pending)))
                sock.sendto(build(DISCOVER, xid, mac, gi), ("255.255.255.255", 67))
                next_send += period
                if next_send < now:  # fell behind (a stall): do not burst to catch up
                    next_send = now + period
            wait = max(0.0, next_send - time.monotonic())
            ready, _, _ = select.select([sock, raw], [], [], wait)
            if sock in ready:
                sock.recv(4096)  # the same reply, taken from the packet socket
            if raw not in ready:
                continue
            frame, address = raw.recvfrom(65_535)
            udp = udp_of(frame, address)
            if udp is None or udp.outgoing or udp.dport != 67 or udp.dst != giaddr:
                continue
            got = parse(udp.payload)
            if got is None:
                continue
            reply_xid, kind, yiaddr, opts = got
            server = socket.inet_ntoa(opts[54]) if len(opts.get(54, b"")) == 4 else ""
            record = {"t": time.monotonic(), "xid": reply_xid, "server": server,
                      "mac": udp.src_mac, "src": udp.src}  # fmt: skip
            if kind == OFFER and reply_xid in pending:
                out.write(json.dumps({**record, "type": "offer"}) + "\n")
                extra = bytes([50, 4]) + yiaddr + bytes([54, 4]) + opts[54]
                sock.sendto(
                    build(REQUEST, reply_xid, pending.pop(reply_xid), gi, extra),
                    ("255.255.255.255", 67),
                )
            elif kind == ACK:
                out.write(json.dumps({**record, "type": "ack"}) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
