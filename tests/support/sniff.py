"""Capture DHCP frames (IPv4 UDP to or from ports 67/68) on one interface.

    python -m tests.support.sniff IFNAME OUTFILE

Run inside a lab namespace (it sees that namespace's interfaces). Prints
``ready`` once the ``AF_PACKET`` socket is bound, then appends one JSON object
per frame to OUTFILE: time, direction (``out`` for frames this host sent),
MACs, IP addresses, ports and the UDP payload in hex. Stops on SIGTERM.
Reassembles nothing: a fragmented datagram shows as its first fragment only.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
DHCP_PORTS = {67, 68}


def decode(frame: bytes) -> dict | None:
    if len(frame) < 14 + 20 + 8 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    if ip[9] != socket.IPPROTO_UDP or len(ip) < ihl + 8:
        return None
    sport, dport, length = struct.unpack_from("!HHH", ip, ihl)
    if sport not in DHCP_PORTS and dport not in DHCP_PORTS:
        return None
    return {
        "dst_mac": frame[0:6].hex(":"),
        "src_mac": frame[6:12].hex(":"),
        "src": socket.inet_ntoa(ip[12:16]),
        "dst": socket.inet_ntoa(ip[16:20]),
        "sport": sport,
        "dport": dport,
        "payload": ip[ihl + 8 : ihl + length].hex(),
    }


def main(ifname: str, out_path: str) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((ifname, 0))
    with open(out_path, "a") as out:
        print("ready", flush=True)
        while True:
            frame, address = sock.recvfrom(65_535)
            record = decode(frame)
            if record is None:
                continue
            record["t"] = time.time()
            record["dir"] = "out" if address[2] == PACKET_OUTGOING else "in"
            out.write(json.dumps(record) + "\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
