"""Many DHCP clients at once, from one socket, for the durability tests.

    python -m tests.support.dhcp_load IFNAME dora COUNT MAX_SECONDS
    python -m tests.support.dhcp_load IFNAME reboot MAX_SECONDS < "MAC ADDRESS" lines

Run inside a lab namespace whose interface has an address (outside the
server's pools). Every message carries the broadcast flag, so replies come
back by broadcast to port 68 whatever the client's state.

``dora``: COUNT clients with made-up MACs each run DISCOVER, OFFER, REQUEST,
ACK, up to 16 exchanges in flight; each ACK is printed as ``ack MAC ADDRESS``
the moment it arrives (the test may kill the server at any point in the
stream: every line printed is an ACK the server sent). Retransmits every
0.5 s. Stops when all are bound, when its standard input closes, or after
MAX_SECONDS; ends with ``done``.

``reboot``: for each ``MAC ADDRESS`` line read, a REQUEST in INIT-REBOOT
(option 50, no server identifier, no ciaddr); prints ``ack MAC ADDRESS`` or
``nak MAC ADDRESS``; ends with ``done``.

Messages are built and read with Rackboot's own codec: these clients test the
shell and the store, not the codec (the real clients and scapy do that).
"""

from __future__ import annotations

import select
import socket
import sys
import time
from ipaddress import IPv4Address

from plugins.dhcp.codec import BROADCAST_FLAG, MalformedPacket, Message, build, parse_untrusted
from plugins.dhcp.options import MessageType, Opt, encode_ip

SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)
WINDOW = 16
RETRANSMIT = 0.5


def open_socket(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, ifname.encode())
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.bind(("0.0.0.0", 68))
    return sock


def message(kind: MessageType, mac: bytes, xid: int, **options: bytes) -> bytes:
    opts = {Opt.MESSAGE_TYPE: bytes([kind])}
    opts.update({Opt[name.upper()]: value for name, value in options.items()})
    return build(Message(xid=xid, flags=BROADCAST_FLAG, chaddr=mac.ljust(16, b"\0"), options=opts))


def replies(sock: socket.socket, timeout: float):
    """Parsed replies that arrive within ``timeout``."""
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            return
        data = sock.recv(65_535)
        try:
            msg = parse_untrusted(data)
        except MalformedPacket:
            continue
        if msg.op == 2 and msg.message_type is not None:
            yield msg


def stdin_closed() -> bool:
    return bool(select.select([sys.stdin], [], [], 0)[0]) and not sys.stdin.read(1)


def dora(sock: socket.socket, count: int, max_seconds: float) -> None:
    macs = {i: bytes([0x02, 0x10, 0, 0, i >> 8, i & 0xFF]) for i in range(count)}
    pending = {i: None for i in range(count)}  # xid -> the REQUEST to resend, or None
    sent_at: dict[int, float] = {}
    deadline = time.monotonic() + max_seconds
    while pending and time.monotonic() < deadline and not stdin_closed():
        now = time.monotonic()
        in_flight = [x for x in pending if x in sent_at]
        for xid in list(pending):
            if xid not in sent_at and len(in_flight) >= WINDOW:
                break
            if now - sent_at.get(xid, 0.0) >= RETRANSMIT:
                request = pending[xid]
                sock.sendto(
                    request or message(MessageType.DISCOVER, macs[xid], xid),
                    ("255.255.255.255", 67),
                )
                if xid not in sent_at:
                    in_flight.append(xid)
                sent_at[xid] = now
        for reply in replies(sock, 0.05):
            xid = reply.xid
            if xid not in pending:
                continue
            if reply.message_type is MessageType.OFFER and pending[xid] is None:
                pending[xid] = message(
                    MessageType.REQUEST, macs[xid], xid,
                    requested_ip=encode_ip(reply.yiaddr), server_id=reply.options[Opt.SERVER_ID],
                )  # fmt: skip
                sock.sendto(pending[xid], ("255.255.255.255", 67))
                sent_at[xid] = time.monotonic()
            elif reply.message_type is MessageType.ACK:
                print(f"ack {macs[xid].hex(':')} {reply.yiaddr}", flush=True)
                del pending[xid]
            elif reply.message_type is MessageType.NAK:
                pending[xid] = None  # start over
                sent_at.pop(xid, None)
    print("done", flush=True)


def reboot(sock: socket.socket, max_seconds: float) -> None:
    clients = {}
    for xid, line in enumerate(sys.stdin.read().split("\n"), start=1):
        if line.strip():
            mac, address = line.split()
            clients[xid] = (bytes.fromhex(mac.replace(":", "")), IPv4Address(address))
    deadline = time.monotonic() + max_seconds
    pending = dict(clients)
    while pending and time.monotonic() < deadline:
        for xid, (mac, address) in pending.items():
            request = message(MessageType.REQUEST, mac, xid, requested_ip=encode_ip(address))
            sock.sendto(request, ("255.255.255.255", 67))
        for reply in replies(sock, RETRANSMIT):
            if reply.xid in pending and reply.message_type in (MessageType.ACK, MessageType.NAK):
                mac, address = pending.pop(reply.xid)
                verdict = "ack" if reply.message_type is MessageType.ACK else "nak"
                print(f"{verdict} {mac.hex(':')} {address}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    ifname, mode = sys.argv[1], sys.argv[2]
    if mode == "dora":
        dora(open_socket(ifname), int(sys.argv[3]), float(sys.argv[4]))
    else:
        reboot(open_socket(ifname), float(sys.argv[3]))
