"""The trio shell of the relay: one socket on the server port, the sans-IO agent.

A single UDP socket on ``0.0.0.0:<port>`` hears every interface; ``IP_PKTINFO``
says which one a datagram came in on: a client-facing interface's requests go
to :meth:`RelayAgent.from_client`, all others, and replies from anywhere, to
:meth:`RelayAgent.from_server` (a server on a client link answers there).
(Per-interface sockets would each receive every broadcast of the others'
interfaces too, through the upstream socket a relay needs anyway.) Replies
leave through the client's interface (``IP_PKTINFO``'s ``ipi_ifindex`` on
``sendmsg``) from its address; a unicast to a client without an address goes
to the MAC an ARP entry names, as the DHCP server does. Both leave as frames through
a packet socket instead where it can (linklayer.py: no IP output path, no copy of a
broadcast looped back to local sockets, no ARP entry); without CAP_NET_RAW, on an
interface that is not Ethernet, or when that socket refuses one, as said before.

Datagrams are relayed as they come; under load (BUSY_DATAGRAMS within GATHER_SECONDS)
in batches: all that came every GATHER_SECONDS, sleeping in trio in between (a wake-up
costs more CPU than relaying a datagram).

With ``when = "active"`` a node that does not hold the rack's lease relays
nothing: a socket filter makes the kernel drop what arrives.

With the DHCP server in the same process (``relay_local_server``): a request for
an address it serves at (the rack's VIP while active) is handed to it, since
sent it would come back through the loopback to no socket of it; its replies
for our ``giaddr`` come back the same way, and replies for us that its sockets
receive (they are bound to their interfaces: the better match) are passed on.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable

import trio

from appliance.logs import get_logger
from plugins.dhcp.netio import (
    CMSG_SPACE,
    IP_PKTINFO,
    delete_arp_entry,
    open_server_socket,
    set_arp_entry,
    set_deaf,
    source_cmsg,
)

from .agent import BROADCAST, MAX_MESSAGE, Deliver, Forward, RelayAgent
from .hookspecs import LocalServer
from .linklayer import FrameLinks, open_packet_socket

log = get_logger("relay")

# A longer datagram is cut to this and the agent drops it (longer than MAX_MESSAGE):
# malformed either way, and the kernel copies no more than a DHCP message.
RECEIVE_SIZE = MAX_MESSAGE + 1
# Gathering. Each wake-up costs more than relaying a datagram: a context switch, and the
# interpreter's caches gone cold while another process ran (Kea, in bench.relay). Woken
# per datagram, a busy relay spent more CPU on being woken than on relaying, and woke
# the server as often. So once BUSY_DATAGRAMS came within GATHER_SECONDS, the relay
# reads all that came every GATHER_SECONDS, sleeping in trio in between (its other tasks
# run), as long as that many keep coming; a datagram then waits up to GATHER_SECONDS
# longer. At 3,500 DORA/s this halved the relay's CPU per exchange and cut the server's
# by a third (bench/README.md, bench.relay). Fewer are relayed as they come: below ~750
# DORA/s gathering would add its wait to every exchange (~2 ms instead of ~0.3 ms at
# 500/s) to save 4 % of a CPU. At most DRAIN_DATAGRAMS per read.
GATHER_SECONDS = 0.001
BUSY_DATAGRAMS = 3
DRAIN_DATAGRAMS = 256


class RelayService:
    def __init__(self, make_agent: Callable[[], RelayAgent], port: int, client_port: int,
                 relaying: bool = True,
                 find_local: Callable[[], LocalServer | None] = lambda: None) -> None:  # fmt: skip
        self.make_agent = make_agent  # reads the interfaces' addresses: at start
        self.agent: RelayAgent | None = None
        self.find_local = find_local  # the DHCP server of this process: asked at start
        self.local: LocalServer | None = None
        self.port, self.client_port = port, client_port
        self.relaying = relaying
        self.sock: socket.socket | None = None
        self.ifindex: dict[int, str] = {}  # client-facing interfaces by index
        # the same by the index as IP_PKTINFO carries it (4 bytes, host order), and other
        # interfaces (the server side) as "": learnt once, not at every datagram
        self._by_pktinfo_index: dict[bytes, str] = {}
        self._not_ours = 0  # how many of the indexes below are other interfaces' ("")
        self._servers: dict[int, tuple[str, int]] = {}
        self._server_by_text: dict[str, int] = {}  # a reply's source, without parsing it
        self._broadcast = ("255.255.255.255", client_port)
        self._cmsg: dict[str, list] = {}  # interface -> IP_PKTINFO for its replies
        # replies as frames; run() gives it its packet socket (none: sendmsg)
        self.frames = FrameLinks(None, port, client_port)
        self.send_errors = 0
        self.arp_refused = 0

    async def run(self, node=None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        agent = self.make_agent()
        self.frames = FrameLinks(open_packet_socket(), self.port, self.client_port)
        try:
            self._prepare(agent)
            self.sock = sock = open_server_socket(None, self.port)
        except BaseException:
            self.frames.close()
            raise
        self.local = self.find_local()
        if self.local is not None:
            self.local.attach_relay(agent.owns, self._from_local)
        try:
            self.set_relaying(self.relaying)
            log.info("relaying", interfaces=",".join(agent.links),
                     servers=",".join(map(_text, agent.config.servers)))  # fmt: skip
            task_status.started()
            await self._serve(agent, sock)
        finally:
            sock.close()
            self.frames.close()

    def _prepare(self, agent: RelayAgent) -> None:
        self.agent = agent
        for link in agent.config.links:
            index = socket.if_nametoindex(link.name)  # OSError names a missing interface
            self._set_index(link.name, index, link.address)
        # Destinations made once: a tuple and its text per datagram cost ~1 µs each
        self._servers = {s: (_text(s), self.port) for s in agent.config.servers}
        self._server_by_text = {_text(s): s for s in agent.config.servers}
        self._broadcast = (_text(BROADCAST), self.client_port)

    def set_relaying(self, relaying: bool) -> None:
        self.relaying = relaying
        if self.sock is not None:
            set_deaf(self.sock, not relaying)

    async def _serve(self, agent: RelayAgent, sock: socket.socket) -> None:
        """Relay datagrams as they come; once BUSY_DATAGRAMS came within GATHER_SECONDS,
        all that came every GATHER_SECONDS, while that many keep coming."""
        window_end, count = 0.0, 0  # datagrams read in the window ending then
        while True:
            await trio.lowlevel.wait_readable(sock)
            now = trio.current_time()
            if now >= window_end:
                window_end, count = now + GATHER_SECONDS, 0
            count += self._drain(agent, sock, DRAIN_DATAGRAMS)
            if count >= BUSY_DATAGRAMS:
                while count >= BUSY_DATAGRAMS:
                    await trio.sleep(GATHER_SECONDS)
                    count = self._drain(agent, sock, DRAIN_DATAGRAMS)
                window_end = 0.0

    def _drain(self, agent: RelayAgent, sock: socket.socket, budget: int) -> int:
        """Relay up to ``budget`` datagrams; how many were read (fewer: the socket is
        empty). The per-datagram path: its CPU is the relay's throughput."""
        recvmsg, by_index = sock.recvmsg, self._by_pktinfo_index
        for count in range(budget):
            try:
                data, ancdata, _flags, source = recvmsg(RECEIVE_SIZE, CMSG_SPACE)
            except BlockingIOError:
                return count
            except OSError as exc:  # e.g. an ICMP error queued on the socket
                log.debug("receive error", error=str(exc))
                continue
            interface = None
            for level, kind, info in ancdata:  # IP_PKTINFO: ipi_ifindex, then addresses
                if kind == IP_PKTINFO and level == socket.IPPROTO_IP and len(info) >= 4:
                    interface = by_index.get(info[:4])
                    if interface is None:
                        interface = self._learn(info[:4])
            # A reply from any side: a server on a client link (an appliance of the rack
            # on the same VLANs) answers there; the agent checks its source and giaddr.
            if interface and data[:1] != b"\x02":
                forward = agent.from_client(data, interface)
                if forward is not None:
                    self._forward(sock, forward)
            else:
                server = self._server_by_text.get(source[0])
                deliver = agent.from_server(data, server or _address(source[0]))
                if deliver is not None:
                    self._deliver(sock, deliver)
        return budget

    def _set_index(self, name: str, index: int, address: int) -> None:
        for old in [i for i, n in self.ifindex.items() if n == name]:
            del self.ifindex[old]
            del self._by_pktinfo_index[old.to_bytes(4, sys.byteorder)]
        self.ifindex[index] = name
        self._by_pktinfo_index[index.to_bytes(4, sys.byteorder)] = name
        self._cmsg[name] = [source_cmsg(address, index)]
        self.frames.learn(name, address)

    def _learn(self, packed_index: bytes) -> str:
        """A client-facing interface deleted and made again (a network reconfigured) has
        a new index: found by its name. Other indexes are remembered as not ours ("")."""
        assert self.agent is not None
        index = int.from_bytes(packed_index, sys.byteorder)
        try:
            name = socket.if_indextoname(index)
        except OSError:
            name = ""
        link = self.agent.links.get(name)
        if link is None:
            if self._not_ours >= 1024:  # interfaces come and go: forget the others
                for key in [k for k, n in self._by_pktinfo_index.items() if not n]:
                    del self._by_pktinfo_index[key]
                self._not_ours = 0
            self._by_pktinfo_index[packed_index] = ""
            self._not_ours += 1
            return ""
        self._set_index(name, index, link.address)
        log.info("client interface has a new index", interface=name, index=index)
        return name

    def _from_local(self, payload: bytes, source: int | None) -> None:
        """A reply for us that the DHCP server of this process made (``source`` None) or
        received from ``source`` on one of its sockets."""
        if self.agent is None or self.sock is None or not self.relaying:
            return
        deliver = self.agent.from_server(payload, source or 0, local=source is None)
        if deliver is not None:
            self._deliver(self.sock, deliver)

    def _deliver(self, sock: socket.socket, deliver: Deliver) -> None:
        payload, interface, address, hwaddr = deliver
        if address == BROADCAST:
            if self.frames.send(interface, payload):
                return
        elif hwaddr is not None and self.frames.send(
            interface, payload, address.to_bytes(4, "big"), hwaddr
        ):
            return
        arp = hwaddr is not None and self._set_arp(sock, deliver)
        if hwaddr is not None and not arp:
            address = BROADCAST
        destination = (
            self._broadcast if address == BROADCAST else (_text(address), self.client_port)
        )
        try:
            sock.sendmsg([payload], self._cmsg[interface], 0, destination)
        except OSError as exc:
            self.send_errors += 1
            log.debug("reply not delivered", interface=interface, error=str(exc))
        if arp:  # the frame has left: the entry would hold a slot of the host's table
            delete_arp_entry(sock, interface, destination[0])

    def _forward(self, sock: socket.socket, forward: Forward) -> None:
        payload = forward.payload
        for server in forward.servers:
            if self.local is not None and self.local.serves(server):
                self.local.inject(payload, server)
                continue
            try:
                sock.sendto(payload, self._servers[server])
            except OSError as exc:  # a full buffer, an unreachable server: the client retries
                self.send_errors += 1
                log.debug("request not forwarded", server=_text(server), error=str(exc))

    def _set_arp(self, sock: socket.socket, deliver: Deliver) -> bool:
        """An ARP entry for the client's new address; False: broadcast instead."""
        assert deliver.hwaddr is not None
        try:
            if set_arp_entry(sock, deliver.interface, _text(deliver.address), deliver.hwaddr):
                return True
        except OSError:
            pass  # ENOBUFS: the neighbour table is full (a DISCOVER storm)
        self.arp_refused += 1
        return False


def _text(address: int) -> str:
    return socket.inet_ntoa(address.to_bytes(4, "big"))


def _address(text: str) -> int:
    return int.from_bytes(socket.inet_aton(text), "big")
