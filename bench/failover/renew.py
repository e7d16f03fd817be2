"""Clients that renew their leases continuously, each in its own namespace, as RENEWING
clients do: the client's view of a failover.

    python -m bench.failover.renew OUT NS:IFNAME:MAC [NS:IFNAME:MAC ...]

Run in the host's namespace (root): the process enters each client's
namespace (``setns``) only to open that client's sockets there, so one
process serves every client. Each client is a bare interface with its own
MAC. It binds through a full DORA (broadcast, the broadcast flag set, from
``0.0.0.0:68``), then puts the address on its interface with the subnet's
prefix (``ip addr replace``, like a real client; its renewals' ACKs are
unicast to it) and from then on renews as RFC 2131 §4.3.2 RENEWING: a
REQUEST with ``ciaddr`` set, no server identifier and no requested address,
flags 0, unicast from its address to the server identifier of its ACK (the
rack's VIP). The bound clients renew in rotation, one every ``PERIOD / n``,
each every ``PERIOD`` (100 ms), whether or not its last renewal was
answered (a new xid each time), so a renewal is always in flight or just
about to be when the active dies. A NAK sends the client back to INIT (its
address removed).

Every reply and every renewal is read from an ``AF_PACKET`` socket on the
client's interface (the UDP socket is drained): a reply's Ethernet source
tells which appliance answered (both name the VIP), an outgoing renewal's
Ethernet destination which appliance the client's ARP entry for the VIP
pointed at. One JSON line per event in OUT, ``t`` on CLOCK_MONOTONIC:

* ``{"type": "renew", "t", "client", "xid", "addr"}`` when a renewal is sent,
* ``{"type": "wire", "t", "client", "xid", "dst_mac", "src", "dst"}`` when its frame leaves
  (late or never while the kernel's ARP entry for the VIP is unresolved),
* ``{"type": "ack"|"nak"|"offer", "t", "client", "xid", "yiaddr", "ciaddr",
  "server", "mac", "src", "renewal"}`` per reply (``renewal``: the answer to
  a renewal).

Runs until SIGTERM; removes the addresses it added when it ends.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from ipaddress import IPv4Address

from bench.failover.frames import ETH_P_ALL, udp_of
from plugins.dhcp.codec import BROADCAST_FLAG, MalformedPacket, Message, build, parse_untrusted
from plugins.dhcp.options import MessageType, Opt

PERIOD = 0.1  # each bound client renews this often
RETRANSMIT = 0.5  # DORA retransmissions
CLONE_NEWNET = 0x40000000
SO_BINDTODEVICE = 25
PARAMS = bytes([1, 3, 6, 15, 51, 54, 58, 59])

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def sockets_in(ns: str, ifname: str) -> tuple[socket.socket, socket.socket]:
    """A UDP socket on 0.0.0.0:68 bound to ``ifname`` and a packet socket on it, both
    made inside namespace ``ns`` (a socket stays in the namespace it was made in)."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            udp.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, ifname.encode())
            udp.bind(("0.0.0.0", 68))
            # ETH_P_ALL: a protocol-bound packet socket never sees outgoing frames
            raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            raw.bind((ifname, 0))
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)
    return udp, raw


@dataclass
class Client:
    name: str
    ns: str
    ifname: str
    mac: bytes
    udp: socket.socket
    raw: socket.socket
    state: str = "init"  # init, selecting, bound
    address: IPv4Address | None = None
    prefix: int = 32
    server: IPv4Address | None = None
    xid: int = 0
    tries: int = 0
    next_send: float = 0.0
    request: bytes = b""
    renewals: dict[int, float] = field(default_factory=dict)  # xid -> sent (monotonic)


class Renewers:
    def __init__(self, clients: list[Client], out) -> None:
        self.clients = clients
        self.out = out
        self.by_raw = {c.raw.fileno(): c for c in clients}
        self.by_udp = {c.udp.fileno(): c for c in clients}
        self.turn = 0
        self.next_renewal = time.monotonic()
        self.xid = int.from_bytes(os.urandom(3), "big") << 8

    def log(self, **event) -> None:
        self.out.write(json.dumps(event) + "\n")

    def _new_xid(self) -> int:
        self.xid = (self.xid + 1) & 0xFFFFFFFF
        return self.xid

    def _message(self, client: Client, kind: MessageType, **kw) -> Message:
        options = {Opt.MESSAGE_TYPE: bytes([kind]), Opt.CLIENT_ID: b"\x01" + client.mac,
                   Opt.PARAMETER_REQUEST_LIST: PARAMS}  # fmt: skip
        options.update(kw.pop("options", {}))
        return Message(xid=client.xid, chaddr=client.mac.ljust(16, b"\0"), options=options, **kw)

    # -- INIT and SELECTING ----------------------------------------------------------------

    def _discover(self, client: Client) -> None:
        client.state, client.xid, client.tries = "init", self._new_xid(), 0
        client.request = build(self._message(client, MessageType.DISCOVER, flags=BROADCAST_FLAG))
        self._broadcast(client)

    def _broadcast(self, client: Client) -> None:
        client.next_send = time.monotonic() + RETRANSMIT
        client.tries += 1
        try:
            client.udp.sendto(client.request, ("255.255.255.255", 67))
        except OSError:
            pass  # retransmitted

    def _select(self, client: Client, offer: Message) -> None:
        options = {Opt.REQUESTED_IP: offer.yiaddr.packed,
                   Opt.SERVER_ID: offer.options.get(Opt.SERVER_ID, b"")}  # fmt: skip
        client.state, client.tries = "selecting", 0
        client.request = build(
            self._message(client, MessageType.REQUEST, flags=BROADCAST_FLAG, options=options)
        )
        self._broadcast(client)

    def _bind(self, client: Client, ack: Message) -> None:
        mask = ack.options.get(Opt.SUBNET_MASK, b"\xff\xff\xff\xff")
        prefix = bin(int.from_bytes(mask, "big")).count("1")
        if client.address is not None and client.address != ack.yiaddr:
            self._ip("del", client)
        client.address, client.prefix = ack.yiaddr, prefix
        client.server = IPv4Address(ack.options[Opt.SERVER_ID])
        self._ip("replace", client)
        client.state = "bound"

    def _unbind(self, client: Client) -> None:
        if client.address is not None:
            self._ip("del", client)
        client.address, client.server = None, None
        client.renewals.clear()
        self._discover(client)

    @staticmethod
    def _ip(how: str, client: Client) -> None:
        subprocess.run(["ip", "-n", client.ns, "-4", "addr", how,
                        f"{client.address}/{client.prefix}", "dev", client.ifname],
                       capture_output=True, timeout=10)  # fmt: skip

    # -- RENEWING --------------------------------------------------------------------------

    def _renew(self, client: Client) -> None:
        client.xid = self._new_xid()
        assert client.address is not None and client.server is not None
        request = build(self._message(client, MessageType.REQUEST, ciaddr=client.address))
        now = time.monotonic()
        client.renewals[client.xid] = now
        if len(client.renewals) > 64:
            client.renewals.pop(next(iter(client.renewals)))
        self.log(type="renew", t=now, client=client.name, xid=client.xid,
                 addr=str(client.address))  # fmt: skip
        try:
            client.udp.sendto(request, (str(client.server), 67))
        except OSError as exc:  # e.g. EHOSTUNREACH once ARP for the VIP failed
            self.log(type="send-error", t=time.monotonic(), client=client.name,
                     xid=client.xid, errno=exc.errno)  # fmt: skip

    def tick(self) -> float:
        """Send what is due; returns the next deadline."""
        now = time.monotonic()
        for client in self.clients:
            if client.state in ("init", "selecting") and now >= client.next_send:
                if client.state == "init" or client.tries >= 4:
                    self._discover(client)
                else:
                    self._broadcast(client)
        if now >= self.next_renewal:
            client = self.clients[self.turn % len(self.clients)]
            self.turn += 1
            if client.state == "bound":
                self._renew(client)
            self.next_renewal += PERIOD / len(self.clients)
            if self.next_renewal < now:  # a stall: do not burst to catch up
                self.next_renewal = now + PERIOD / len(self.clients)
        deadlines = [self.next_renewal] + [
            c.next_send for c in self.clients if c.state in ("init", "selecting")
        ]
        return min(deadlines)

    def frame(self, client: Client) -> None:
        frame, address = client.raw.recvfrom(65_535)
        udp = udp_of(frame, address)
        if udp is None:
            return
        if udp.outgoing:
            if udp.sport == 68 and udp.dport == 67 and udp.dst != "255.255.255.255":
                xid = int.from_bytes(udp.payload[4:8], "big") if len(udp.payload) > 8 else -1
                self.log(type="wire", t=time.monotonic(), client=client.name, xid=xid,
                         dst_mac=udp.dst_mac, src=udp.src, dst=udp.dst)  # fmt: skip
            return
        if udp.sport != 67 or udp.dport != 68:
            return
        try:
            msg = parse_untrusted(udp.payload)
        except MalformedPacket:
            return
        if msg.op != 2 or msg.chaddr[:6] != client.mac:
            return
        kind = msg.message_type
        server = msg.options.get(Opt.SERVER_ID, b"")
        renewal = msg.xid in client.renewals
        if kind in (MessageType.OFFER, MessageType.ACK, MessageType.NAK):
            self.log(type=kind.name.lower(), t=time.monotonic(), client=client.name,
                     xid=msg.xid, yiaddr=str(msg.yiaddr), ciaddr=str(msg.ciaddr),
                     server=str(IPv4Address(server)) if len(server) == 4 else "",
                     mac=udp.src_mac, src=udp.src, renewal=renewal)  # fmt: skip
        if renewal:
            client.renewals.pop(msg.xid, None)
            if kind is MessageType.NAK:
                self._unbind(client)
            elif kind is MessageType.ACK and msg.yiaddr != client.address:
                self._bind(client, msg)  # the bench reports it; the client takes what it got
            return
        if msg.xid != client.xid:
            return
        if kind is MessageType.OFFER and client.state == "init":
            self._select(client, msg)
        elif kind is MessageType.ACK and client.state == "selecting":
            self._bind(client, msg)
        elif kind is MessageType.NAK and client.state == "selecting":
            self._unbind(client)

    def run(self) -> None:
        for client in self.clients:
            self._discover(client)
        polled = list(self.by_raw) + list(self.by_udp)
        while True:
            deadline = self.tick()
            ready, _, _ = select.select(polled, [], [], max(0.0, deadline - time.monotonic()))
            for fd in ready:
                if fd in self.by_udp:
                    self.by_udp[fd].udp.recv(65_535)  # the same reply, read from the raw socket
                else:
                    self.frame(self.by_raw[fd])

    def close(self) -> None:
        for client in self.clients:
            if client.address is not None:
                self._ip("del", client)


def main(argv: list[str]) -> int:
    out_path, specs = argv[0], argv[1:]
    clients = []
    for spec in specs:
        ns, ifname, mac = spec.split(":", 2)
        udp, raw = sockets_in(ns, ifname)
        clients.append(Client(f"{ns.rsplit('-', 1)[-1]}", ns, ifname, bytes.fromhex(mac.replace(":", "")), udp, raw))  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(out_path, "a", buffering=1) as out:
        renewers = Renewers(clients, out)
        try:
            renewers.run()
        finally:
            renewers.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
