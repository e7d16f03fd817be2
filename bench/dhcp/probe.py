"""Readiness probe: one DORA shaped exactly like perfdhcp's, with a diagnosis when it fails.

Run inside the client namespace: ``python -m bench.dhcp.probe GIADDR [TIMEOUT]``.
Exit 0 and print the leased address on success; exit 1 with one line saying what
went wrong otherwise (no OFFER, no ACK, NAK, or a reply sent to the client port
68 where perfdhcp, acting as a relay, only listens on 67).

perfdhcp's own ``-n 1`` is no good as a probe here: it exits as soon as it has
sent the REQUEST and counts the ACK as dropped, with or without ``-W``.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import time

MAGIC = b"\x63\x82\x53\x63"
DISCOVER, OFFER, REQUEST, ACK, NAK = 1, 2, 3, 5, 6
RETRANSMIT = 0.5  # seconds between retransmissions of the same message
NAMES = {1: "DISCOVER", 2: "OFFER", 3: "REQUEST", 5: "ACK", 6: "NAK"}


def build(msg: int, xid: int, mac: bytes, giaddr: bytes, extra: bytes = b"") -> bytes:
    """A BOOTREQUEST as perfdhcp sends it: hops 1, giaddr = our address, flags 0."""
    header = struct.pack(
        "!BBBBIHH4s4s4s4s16s64s128s",
        1, 1, 6, 1, xid, 0, 0,
        b"\0" * 4, b"\0" * 4, b"\0" * 4, giaddr,
        mac.ljust(16, b"\0"), b"", b"",
    )  # fmt: skip
    opts = bytes([53, 1, msg]) + bytes([55, 7, 1, 28, 2, 3, 15, 6, 12])
    opts += bytes([61, 7, 1]) + mac + extra + b"\xff"
    return header + MAGIC + opts


def parse(data: bytes) -> tuple[int, int, bytes, dict[int, bytes]] | None:
    """(xid, message type, yiaddr, options) of a BOOTREPLY, or None."""
    if len(data) < 240 or data[0] != 2 or data[236:240] != MAGIC:
        return None
    xid = struct.unpack("!I", data[4:8])[0]
    opts: dict[int, bytes] = {}
    i = 240
    while i < len(data):
        code = data[i]
        if code == 0:
            i += 1
            continue
        if code == 255 or i + 1 >= len(data):
            break
        length = data[i + 1]
        opts[code] = data[i + 2 : i + 2 + length]
        i += 2 + length
    mtype = opts.get(53, b"\0")[0]
    return xid, mtype, data[16:20], opts


def probe(giaddr: str, timeout: float) -> tuple[bool, str]:
    relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    relay.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    relay.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    relay.bind((giaddr, 67))  # where perfdhcp listens: the relay's server port
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # only to diagnose port-68 replies
    client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    client.bind(("0.0.0.0", 68))
    mac = b"\x02" + os.urandom(5)
    xid = int.from_bytes(os.urandom(4), "big")
    gi = socket.inet_aton(giaddr)
    deadline = time.monotonic() + timeout

    def exchange(packet: bytes, want: int) -> tuple[int, bytes, dict[int, bytes]] | str:
        resend = 0.0
        while (left := deadline - time.monotonic()) > 0:
            if time.monotonic() >= resend:  # retransmit: the server may still be binding
                relay.sendto(packet, ("255.255.255.255", 67))
                resend = time.monotonic() + RETRANSMIT
            ready, _, _ = select.select([relay, client], [], [], min(left, RETRANSMIT))
            for sock in ready:
                data, peer = sock.recvfrom(4096)
                got = parse(data)
                if got is None or got[0] != xid:
                    continue
                if sock is client:
                    return (
                        f"{NAMES.get(got[1], got[1])} from {peer[0]}:{peer[1]} went to port 68: "
                        "a relayed request (giaddr set) must be answered to giaddr port 67"
                    )
                if got[1] == NAK:
                    return f"NAK from {peer[0]} (message {got[3].get(56, b'').decode(errors='replace')!r})"
                if got[1] == want:
                    return got[1], got[2], got[3]
        return f"no {NAMES[want]} within {timeout:g} s"

    t0 = time.monotonic()
    offer = exchange(build(DISCOVER, xid, mac, gi), OFFER)
    if isinstance(offer, str):
        return False, offer
    _, yiaddr, opts = offer
    if 54 not in opts:
        return (
            False,
            "OFFER without a server identifier (option 54): perfdhcp copies it into REQUEST",
        )
    extra = bytes([50, 4]) + yiaddr + bytes([54, 4]) + opts[54]
    ack = exchange(build(REQUEST, xid, mac, gi, extra), ACK)
    if isinstance(ack, str):
        return False, ack
    took = (time.monotonic() - t0) * 1000
    return True, f"leased {socket.inet_ntoa(ack[1])} in {took:.1f} ms"


def main(argv: list[str]) -> int:
    giaddr = argv[0]
    timeout = float(argv[1]) if len(argv) > 1 else 5.0
    try:
        ok, text = probe(giaddr, timeout)
    except OSError as exc:
        ok, text = False, f"probe socket error: {exc}"
    print(text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
