"""What perfdhcp sends as directly attached clients, how their replies reach it, and the
two small tools run inside the lab's namespaces (``python -m bench.relay.wire ...``):

* ``probe CLIENT_ADDR TIMEOUT [--broadcast]``: one DORA as a directly attached client
  (from port 68, ``giaddr`` 0, ``hops`` 0), answered through the relay; the readiness
  check before every run.
* ``capture IFACE SECONDS``: the DHCP messages seen on an interface, one JSON line each
  (an ``AF_PACKET`` socket, no tcpdump needed); the wire check that the relay relays.

perfdhcp 2.2 (``-4 -l IFACE``) always acts as a relay (``giaddr`` = its address, hops 1,
replies expected on port 67: bench/README.md, "What perfdhcp sends"). To make it a
crowd of directly attached clients (bench/README.md, ``bench.relay``):

* both messages come from **templates** (``-T``): perfdhcp copies a template's BOOTP
  header as it is (``giaddr`` 0, ``hops`` 0, the flags we choose) and writes only the
  xid (``-X``), the MAC (``-O``: the offset of its last octet), the elapsed seconds
  (``-E``) and, in the REQUEST, options 54 (``-S``) and 50 (``-I``) from the OFFER.
  (``-J`` with ``0.0.0.0`` clears ``giaddr`` in the DISCOVER only: perfdhcp then copies
  the OFFER's ``giaddr``, the relay's own address, into the REQUEST and a relay drops
  it as a loop.) No client identifier (option 61) is sent: a template's would be the
  same for every client, so the server tells clients apart by ``chaddr``;
* ``-L 68``: perfdhcp's socket is bound to ``ITS_ADDRESS:68``;
* a relay answers a client at ``yiaddr`` (unicast to ``chaddr``'s MAC) or at
  255.255.255.255, never at perfdhcp's address: an nftables rule on the client's
  interface (``netdev`` ingress, before IP) rewrites the destination address of
  every UDP datagram to port 68 to perfdhcp's and marks the frame as ours
  (``meta pkttype set host``; a frame to another MAC would be dropped). The relay's
  work is untouched: the rule runs on the client's side of the wire.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import sys
import time

from bench.dhcp.probe import ACK, DISCOVER, MAGIC, NAK, NAMES, OFFER, REQUEST, parse

CLIENT_PORT, SERVER_PORT = 68, 67
BROADCAST_FLAG = 0x8000
TEMPLATE_MAC = bytes.fromhex("000c01020304")  # perfdhcp's default base MAC
_PRL = bytes([55, 7, 1, 28, 2, 3, 15, 6, 12])  # what perfdhcp itself requests
# Offsets in the templates (BOOTP header: xid at 4, secs at 8, chaddr at 28..33).
XID_OFFSET, SECS_OFFSET, MAC_LAST_OFFSET = 4, 8, 28 + 5
RETRANSMIT = 0.5  # probe: seconds between retransmissions
CAPTURE_MAX = 10_000  # capture: messages kept at most
ETH_P_ALL = 0x0003


def _header(flags: int, mac: bytes = TEMPLATE_MAC, xid: int = 0) -> bytes:
    """A client's BOOTREQUEST header: hops 0, ciaddr/giaddr 0."""
    return struct.pack(
        "!BBBBIHH4s4s4s4s16s64s128s",
        1, 1, 6, 0, xid, 0, flags,
        bytes(4), bytes(4), bytes(4), bytes(4), mac.ljust(16, b"\0"), b"", b"",
    )  # fmt: skip


def templates(flags: int) -> tuple[bytes, bytes, dict[str, int]]:
    """The DISCOVER and REQUEST templates and the offsets perfdhcp writes into them."""
    discover = _header(flags) + MAGIC + bytes([53, 1, DISCOVER]) + _PRL + b"\xff"
    request = _header(flags) + MAGIC + bytes([53, 1, REQUEST])
    requested_ip = len(request)
    request += bytes([50, 4, 0, 0, 0, 0])
    server_id = len(request)
    request += bytes([54, 4, 0, 0, 0, 0]) + _PRL + b"\xff"
    return discover, request, {"requested_ip": requested_ip, "server_id": server_id}


def perfdhcp_template_args(directory, broadcast: bool) -> list[str]:
    """perfdhcp options that make it send the templates (written into ``directory``)."""
    discover, request, at = templates(BROADCAST_FLAG if broadcast else 0)
    paths = []
    for name, body in (("discover", discover), ("request", request)):
        path = directory / f"perfdhcp-{name}.hex"
        path.write_text(body.hex())
        paths.append(str(path))
    return [
        "-L", str(CLIENT_PORT),
        "-T", paths[0], "-T", paths[1],
        "-X", str(XID_OFFSET), "-X", str(XID_OFFSET),
        "-O", str(MAC_LAST_OFFSET), "-O", str(MAC_LAST_OFFSET),
        "-E", str(SECS_OFFSET),
        "-I", str(at["requested_ip"]), "-S", str(at["server_id"]),
    ]  # fmt: skip


def nft_rules(iface: str, address: str) -> str:
    """The client-side rule: every UDP datagram to port 68 arriving on ``iface`` is for
    ``address`` (perfdhcp's socket), whatever its destination MAC and address."""
    return (
        "table netdev rackboot_bench_relay {\n"
        f'  chain replies {{ type filter hook ingress device "{iface}" priority 0;\n'
        f"    udp dport {CLIENT_PORT} ip daddr set {address} meta pkttype set host; }}\n"
        "}\n"
    )


# -- probe: one directly attached client's DORA --------------------------------------------


def client_message(msg: int, xid: int, mac: bytes, flags: int, extra: bytes = b"") -> bytes:
    opts = bytes([53, 1, msg]) + _PRL + extra + b"\xff"
    return _header(flags, mac, xid) + MAGIC + opts


def probe(client_addr: str, timeout: float, broadcast: bool) -> tuple[bool, str]:
    """DISCOVER/OFFER/REQUEST/ACK from ``client_addr``:68 to 255.255.255.255:67, giaddr 0."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.bind((client_addr, CLIENT_PORT))  # as perfdhcp -L 68 binds
    mac = b"\x02" + os.urandom(5)
    xid = int.from_bytes(os.urandom(4), "big")
    flags = BROADCAST_FLAG if broadcast else 0
    deadline = time.monotonic() + timeout

    def exchange(packet: bytes, want: int):
        resend = 0.0
        while (left := deadline - time.monotonic()) > 0:
            if time.monotonic() >= resend:
                sock.sendto(packet, ("255.255.255.255", SERVER_PORT))
                resend = time.monotonic() + RETRANSMIT
            ready, _, _ = select.select([sock], [], [], min(left, RETRANSMIT))
            if not ready:
                continue
            data, peer = sock.recvfrom(4096)
            got = parse(data)
            if got is None or got[0] != xid:
                continue
            if got[1] == NAK:
                return f"NAK from {peer[0]}"
            if got[1] == want:
                return got
        return f"no {NAMES[want]} within {timeout:g} s"

    t0 = time.monotonic()
    offer = exchange(client_message(DISCOVER, xid, mac, flags), OFFER)
    if isinstance(offer, str):
        return False, offer
    _, _, yiaddr, opts = offer
    if 82 in opts:
        return False, "the OFFER reached the client with option 82 still in it"
    extra = bytes([50, 4]) + yiaddr + bytes([54, 4]) + opts.get(54, bytes(4))
    ack = exchange(client_message(REQUEST, xid, mac, flags, extra), ACK)
    if isinstance(ack, str):
        return False, ack
    return True, f"leased {socket.inet_ntoa(ack[2])} in {(time.monotonic() - t0) * 1000:.1f} ms"


# -- capture: DHCP messages on an interface ------------------------------------------------


def describe(frame: bytes) -> dict | None:
    """One Ethernet frame -> the DHCP fields the wire check looks at, or None."""
    if len(frame) < 14 + 20 + 8 + 240 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    ihl = (ip[0] & 15) * 4
    if ip[9] != 17 or len(ip) < ihl + 8 + 240:
        return None
    sport, dport = struct.unpack("!HH", ip[ihl : ihl + 4])
    if {sport, dport}.isdisjoint({CLIENT_PORT, SERVER_PORT}):
        return None
    dhcp = ip[ihl + 8 :]
    got = parse(dhcp) if dhcp[0] == 2 else None
    options = got[3] if got else _options(dhcp)
    return {
        "src": f"{socket.inet_ntoa(ip[12:16])}:{sport}",
        "dst": f"{socket.inet_ntoa(ip[16:20])}:{dport}",
        "op": dhcp[0],
        "hops": dhcp[3],
        "flags": struct.unpack("!H", dhcp[10:12])[0],
        "giaddr": socket.inet_ntoa(dhcp[24:28]),
        "type": NAMES.get((options.get(53) or b"\0")[0], "?"),
        "option82": 82 in options,
    }


def _options(dhcp: bytes) -> dict[int, bytes]:
    """Options of a BOOTREQUEST (probe.parse reads replies only)."""
    as_reply = b"\x02" + dhcp[1:]
    got = parse(as_reply)
    return got[3] if got else {}


def capture(iface: str, seconds: float) -> None:
    # ETH_P_ALL: a protocol-bound packet socket sees only frames coming in, not those
    # the relay sends. (bind() takes the protocol in host order, socket() in network order.)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((iface, ETH_P_ALL))
    deadline = time.monotonic() + seconds
    seen = 0
    while (left := deadline - time.monotonic()) > 0 and seen < CAPTURE_MAX:
        ready, _, _ = select.select([sock], [], [], min(left, 0.2))
        if not ready:
            continue
        frame = sock.recv(65536)
        info = describe(frame)
        if info is not None:
            seen += 1
            print(json.dumps(info), flush=True)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "probe":
        try:
            ok, text = probe(argv[1], float(argv[2]), "--broadcast" in argv[3:])
        except OSError as exc:
            ok, text = False, f"probe socket error: {exc}"
        print(text, flush=True)
        return 0 if ok else 1
    if len(argv) == 3 and argv[0] == "capture":
        capture(argv[1], float(argv[2]))
        return 0
    print(
        "usage: python -m bench.relay.wire probe CLIENT_ADDR TIMEOUT [--broadcast]\n"
        "       python -m bench.relay.wire capture IFACE SECONDS",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
