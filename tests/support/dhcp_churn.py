"""A population of DHCP clients that bind, renew, leave and arrive, recording every answer.

    python -m tests.support.dhcp_churn IFNAME CLIENTS SECONDS [--leave P] [--seed S]

Run inside a lab namespace whose interface has an address. Each client runs
RFC 2131's states with short timers: INIT (DISCOVER, broadcast) -> SELECTING
(REQUEST naming the offer's server) -> BOUND; at T1 = lease/2 it renews
(REQUEST with ciaddr, unicast to its server identifier), and past T2 = 7/8
of the lease it rebinds (broadcast). A NAK sends it back to INIT. After each
renewal a client leaves with probability P (it stops, its lease runs out) and
a new client with a new MAC takes its place, so addresses are reused.
Retransmissions every 0.5 s.

Like a real client, each one puts its bound address on the interface (``ip addr
add ADDRESS/32``: a renewal's ACK is unicast to it) and takes it off when it
leaves or is NAKed; DISCOVERs and REQUESTs before binding carry the broadcast
flag (the interface does not have the offered address yet). Needs root in
its namespace.

Every answer is printed the moment it arrives, for a checker
(tests/support/dhcp_checker.py): ``ack T MAC ADDRESS LEASE SERVER`` and
``nak T MAC ADDRESS SERVER``, where T is the wall-clock time the client sent
the request the answer is for (RFC 2131 §4.4.1: the lease runs from then).
Ends with ``done`` after SECONDS, or when its standard input closes.
"""

from __future__ import annotations

import argparse
import random
import select
import socket
import subprocess
import time
from dataclasses import dataclass, field
from ipaddress import IPv4Address

from plugins.dhcp.codec import BROADCAST_FLAG, Message, build, parse_untrusted
from plugins.dhcp.options import MessageType, Opt, encode_ip
from tests.support.dhcp_load import open_socket, stdin_closed

RETRANSMIT = 0.5


@dataclass
class Client:
    mac: bytes
    xid: int
    state: str = "init"  # init, selecting, bound, renewing, rebinding
    address: IPv4Address | None = None
    server: bytes = b""
    lease: float = 0.0
    bound_at: float = 0.0  # wall time the request that bound it was sent
    sent_at: float = 0.0  # wall time of the last request sent (for T above)
    next_send: float = 0.0  # monotonic
    request: bytes = field(default=b"", repr=False)


class Churn:
    def __init__(self, sock: socket.socket, ifname: str, clients: int, leave: float,
                 rng: random.Random) -> None:  # fmt: skip
        self.sock, self.ifname, self.leave, self.rng = sock, ifname, leave, rng
        self.serial = 0
        self.clients: dict[int, Client] = {}
        for _ in range(clients):
            self._arrive()

    def _arrive(self) -> None:
        self.serial += 1
        mac = bytes([0x02, 0x20, *self.serial.to_bytes(4, "big")])
        xid = self.rng.getrandbits(31) | 1
        self.clients[xid] = Client(mac, xid)

    def _send(self, client: Client, kind: MessageType, to: str, **options) -> None:
        opts = {Opt.MESSAGE_TYPE: bytes([kind])}
        opts.update({Opt[n.upper()]: v for n, v in options.items()})
        ciaddr = client.address if client.state in ("renewing", "rebinding") else None
        msg = Message(xid=client.xid, chaddr=client.mac.ljust(16, b"\0"), options=opts,
                      ciaddr=ciaddr or IPv4Address(0),
                      flags=0 if ciaddr else BROADCAST_FLAG)  # fmt: skip
        client.request = build(msg)
        client.sent_at = time.time()
        client.next_send = time.monotonic() + RETRANSMIT
        try:
            self.sock.sendto(client.request, (to, 67))
        except OSError:
            pass  # no route yet (the VIP moving): retransmitted

    def tick(self) -> None:
        now_mono, now = time.monotonic(), time.time()
        for client in list(self.clients.values()):
            if client.state in ("bound", "renewing") and now >= client.bound_at + client.lease * 7 / 8:
                client.state = "rebinding"
                client.next_send = 0.0
            elif client.state == "bound" and now >= client.bound_at + client.lease / 2:
                client.state = "renewing"
                client.next_send = 0.0
            if client.state == "bound" or now_mono < client.next_send:
                continue
            if client.state == "init":
                self._send(client, MessageType.DISCOVER, "255.255.255.255")
            elif client.state == "selecting":
                self._resend(client, "255.255.255.255")
            elif client.state == "renewing":
                self._send(client, MessageType.REQUEST, str(IPv4Address(client.server)))
            elif client.state == "rebinding":
                self._send(client, MessageType.REQUEST, "255.255.255.255")

    def _resend(self, client: Client, to: str) -> None:
        client.next_send = time.monotonic() + RETRANSMIT
        try:
            self.sock.sendto(client.request, (to, 67))
        except OSError:
            pass

    def answer(self, msg: Message) -> None:
        client = self.clients.get(msg.xid)
        if client is None or msg.chaddr[:6] != client.mac:
            return
        kind, server = msg.message_type, msg.options.get(Opt.SERVER_ID, b"")
        if kind is MessageType.OFFER and client.state == "init":
            client.state = "selecting"
            self._send(client, MessageType.REQUEST, "255.255.255.255",
                       requested_ip=encode_ip(msg.yiaddr), server_id=server)  # fmt: skip
        elif kind is MessageType.ACK and client.state in ("selecting", "renewing", "rebinding"):
            lease = int.from_bytes(msg.options.get(Opt.LEASE_TIME, b"\0\0\0\0"), "big")
            print(f"ack {client.sent_at:.6f} {client.mac.hex(':')} {msg.yiaddr} {lease} "
                  f"{IPv4Address(server) if len(server) == 4 else '-'}", flush=True)  # fmt: skip
            renewed = client.state != "selecting"
            if client.address != msg.yiaddr:
                self._address("del", client.address)
                self._address("replace", msg.yiaddr)
            client.state, client.address, client.lease = "bound", msg.yiaddr, float(lease)
            client.server, client.bound_at = server or client.server, client.sent_at
            if renewed and self.rng.random() < self.leave:
                del self.clients[client.xid]  # it leaves: its lease runs out
                self._address("del", client.address)
                self._arrive()
        elif kind is MessageType.NAK and client.state != "bound":
            print(f"nak {client.sent_at:.6f} {client.mac.hex(':')} {client.address or '-'} "
                  f"{IPv4Address(server) if len(server) == 4 else '-'}", flush=True)  # fmt: skip
            self._address("del", client.address)
            client.state, client.address, client.next_send = "init", None, 0.0

    def _address(self, how: str, address: IPv4Address | None) -> None:
        if address is not None:
            subprocess.run(["ip", "-4", "addr", how, f"{address}/32", "dev", self.ifname],
                           capture_output=True, timeout=5)  # fmt: skip

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stdin_closed():
            self.tick()
            readable, _, _ = select.select([self.sock], [], [], 0.02)
            while readable:
                data = self.sock.recv(65_535)
                try:
                    msg = parse_untrusted(data)
                except ValueError:
                    msg = None
                if msg is not None and msg.op == 2:
                    self.answer(msg)
                readable, _, _ = select.select([self.sock], [], [], 0)
        print("done", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ifname")
    parser.add_argument("clients", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("--leave", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    churn = Churn(open_socket(args.ifname), args.ifname, args.clients, args.leave,
                  random.Random(args.seed))  # fmt: skip
    churn.run(args.seconds)

if __name__ == "__main__":
    main()
