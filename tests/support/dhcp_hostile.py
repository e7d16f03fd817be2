"""Malformed and hostile DHCP traffic crafted with scapy, broadcast on one link.

    python -m tests.support.dhcp_hostile IFNAME STORM_MACS MAX_SECONDS INTERVAL

Run inside a lab namespace whose interface has an address. Prints ``ready``
once scapy is loaded and the socket bound, then sends rounds until its
standard input closes (or MAX_SECONDS pass), INTERVAL seconds apart: one packet of each malformed kind
in :data:`KINDS` plus a burst of DISCOVERs from STORM_MACS random MACs (each
round reuses the same MACs: a storm, not a pool-exhaustion attack). Then it
prints a JSON object: how many of each kind it sent, keyed by the drop reason
the server is expected to count them under (``discover`` for the storm).
"""

from __future__ import annotations

import json
import secrets
import select
import socket
import sys
import time
from collections.abc import Callable

from scapy.all import BOOTP, DHCP, raw

COOKIE = b"\x63\x82\x53\x63"
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)


def header(**fields) -> bytes:
    """The 236-byte BOOTP header, from scapy."""
    fields.setdefault("chaddr", secrets.token_bytes(6))
    fields.setdefault("xid", secrets.randbits(32))
    return raw(BOOTP(**fields))


def dhcp(options: list, **fields) -> bytes:
    """A well-formed DHCP message, from scapy."""
    fields.setdefault("chaddr", secrets.token_bytes(6))
    fields.setdefault("xid", secrets.randbits(32))
    return raw(BOOTP(**fields) / DHCP(options=options))


def truncated_option() -> bytes:
    # Host name claims 40 bytes; 3 follow.
    return header() + COOKIE + b"\x35\x01\x01" + b"\x0c\x28abc"


def bad_overload() -> bytes:
    return header() + COOKIE + b"\x35\x01\x01" + b"\x34\x01\x07\xff"


def overload_inside_file() -> bytes:
    # Overload 1 moves options into 'file', which carries another option 52.
    head = bytearray(header())
    head[108:112] = b"\x34\x01\x01\xff"
    return bytes(head) + COOKIE + b"\x35\x01\x01\x34\x01\x01\xff"


def too_many_options() -> bytes:
    # 1100 instances of a private option: past the parser's cap of 1024 repeats.
    return header() + COOKIE + b"\x35\x01\x01" + b"\xfa\x00" * 1100 + b"\xff"


def bad_cookie() -> bytes:
    packet = bytearray(dhcp([("message-type", "discover"), "end"]))
    packet[236:240] = b"\x63\x82\x53\x64"
    return bytes(packet)


def too_short() -> bytes:
    return header()[:200]


def bad_hlen() -> bytes:
    return dhcp([("message-type", "discover"), "end"], hlen=17)


def bad_option_length() -> bytes:
    # Message type is one byte long by definition.
    return header() + COOKIE + b"\x35\x02\x01\x01\xff"


def bad_message_type() -> bytes:
    return header() + COOKIE + b"\x35\x01\x63\xff"


def reply_from_a_client() -> bytes:
    return dhcp([("message-type", "offer"), "end"], op=2)


def offer_from_a_client() -> bytes:
    return dhcp([("message-type", "offer"), "end"])


def bootp_only() -> bytes:
    return header() + COOKIE + b"\xff"


KINDS: dict[str, Callable[[], bytes]] = {
    "malformed:truncated-option": truncated_option,
    "malformed:bad-overload": bad_overload,
    "malformed:bad-cookie": bad_cookie,
    "malformed:too-short": too_short,
    "malformed:bad-hlen": bad_hlen,
    "malformed:too-many-options": too_many_options,
    "malformed:bad-option-length": bad_option_length,
    "malformed:bad-message-type": bad_message_type,
    "not-a-request": reply_from_a_client,
    "unhandled-type": offer_from_a_client,
    "bootp": bootp_only,
}
KINDS_OVERLOAD_IN_FILE = "malformed:bad-overload"  # overload_inside_file counts here too


def main(ifname: str, storm_macs: int, max_seconds: float, interval: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, ifname.encode())
    sock.bind(("0.0.0.0", 68))
    macs = [b"\x02" + secrets.token_bytes(5) for _ in range(storm_macs)]
    storm = [
        dhcp([("message-type", "discover"), ("hostname", "storm"), "end"], chaddr=mac)
        for mac in macs
    ]
    sent = dict.fromkeys([*KINDS, "discover"], 0)
    print("ready", flush=True)
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        if select.select([sys.stdin], [], [], 0)[0] and not sys.stdin.read(1):
            break  # the test closed our stdin: stop
        for reason, make in KINDS.items():
            sock.sendto(make(), ("255.255.255.255", 67))
            sent[reason] += 1
        sock.sendto(overload_inside_file(), ("255.255.255.255", 67))
        sent[KINDS_OVERLOAD_IN_FILE] += 1
        for packet in storm:
            sock.sendto(packet, ("255.255.255.255", 67))
            sent["discover"] += 1
        time.sleep(interval)
    print(json.dumps(sent), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
