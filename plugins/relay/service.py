"""The trio shell of the relay: one socket on the server port, the sans-IO agent.

A single UDP socket on ``0.0.0.0:<port>`` hears every interface; ``IP_PKTINFO``
says which one a datagram came in on: a client-facing interface's requests go
to :meth:`RelayAgent.from_client`, all others, and replies from anywhere, to
:meth:`RelayAgent.from_server` (a server on a client link answers there).
(Per-interface sockets would each receive every broadcast of the others'
interfaces too, through the upstream socket a relay needs anyway.) Replies
leave through the client's interface (``IP_PKTINFO``'s ``ipi_ifindex`` on
``sendmsg``) from its address; a unicast to a client without an address goes
to the MAC an ARP entry names, as the DHCP server does.

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
from collections.abc import Callable

import trio

from appliance.logs import get_logger
from plugins.dhcp.netio import (
    CMSG_SPACE,
    arrival_address,
    delete_arp_entry,
    open_server_socket,
    set_arp_entry,
    set_deaf,
    source_cmsg,
)

from .agent import BROADCAST, Deliver, RelayAgent
from .hookspecs import LocalServer

log = get_logger("relay")

MAX_DATAGRAM = 65_535
DRAIN_BATCH = 64


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
        self._not_ours: set[int] = set()  # indexes of other interfaces (the server side)
        self._servers: dict[int, tuple[str, int]] = {}
        self._broadcast = ("255.255.255.255", client_port)
        self._cmsg: dict[str, list] = {}  # interface -> IP_PKTINFO for its replies
        self.send_errors = 0
        self.arp_refused = 0

    async def run(self, node=None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.agent = agent = self.make_agent()
        for link in agent.config.links:
            index = socket.if_nametoindex(link.name)  # OSError names a missing interface
            self.ifindex[index] = link.name
            self._cmsg[link.name] = [source_cmsg(link.address, index)]
        # Destinations made once: a tuple and its text per datagram cost ~1 µs each
        self._servers = {s: (_text(s), self.port) for s in agent.config.servers}
        self._broadcast = (_text(BROADCAST), self.client_port)
        self.sock = sock = open_server_socket(None, self.port)
        self.local = self.find_local()
        if self.local is not None:
            self.local.attach_relay(agent.owns, self._from_local)
        try:
            self.set_relaying(self.relaying)
            log.info("relaying", interfaces=",".join(agent.links),
                     servers=",".join(map(_text, agent.config.servers)))  # fmt: skip
            task_status.started()
            while True:
                await trio.lowlevel.wait_readable(sock)
                while not self._drain(agent, sock):
                    await trio.lowlevel.checkpoint()
        finally:
            sock.close()

    def set_relaying(self, relaying: bool) -> None:
        self.relaying = relaying
        if self.sock is not None:
            set_deaf(self.sock, not relaying)

    def _drain(self, agent: RelayAgent, sock: socket.socket) -> bool:
        """Relay up to DRAIN_BATCH datagrams; True when the socket is empty."""
        for _ in range(DRAIN_BATCH):
            try:
                data, ancdata, _flags, source = sock.recvmsg(MAX_DATAGRAM, CMSG_SPACE)
            except BlockingIOError:
                return True
            except OSError as exc:  # e.g. an ICMP error queued on the socket
                log.debug("receive error", error=str(exc))
                continue
            found = arrival_address(ancdata)
            interface = self.ifindex.get(found[0]) if found else None
            if interface is None and found and found[0] not in self._not_ours:
                interface = self._learn(found[0])
            # A reply from any side: a server on a client link (an appliance of the rack
            # on the same VLANs) answers there; the agent checks its source and giaddr.
            if interface is not None and data[:1] != b"\x02":
                for forward in agent.from_client(data, interface).forwards:
                    if self.local is not None and self.local.serves(forward.server):
                        self.local.inject(forward.payload, forward.server)
                    else:
                        self._send(sock, forward.payload, self._servers[forward.server])
            else:
                outcome = agent.from_server(data, _address(source[0]))
                if outcome.deliver is not None:
                    self._deliver(sock, outcome.deliver)
        return False

    def _learn(self, index: int) -> str | None:
        """A client-facing interface deleted and made again (a network reconfigured) has
        a new index: found by its name. Other indexes are remembered as not ours."""
        assert self.agent is not None
        try:
            name = socket.if_indextoname(index)
        except OSError:
            name = ""
        link = self.agent.links.get(name)
        if link is None:
            if len(self._not_ours) >= 1024:
                self._not_ours.clear()
            self._not_ours.add(index)
            return None
        for old in [i for i, n in self.ifindex.items() if n == name]:
            del self.ifindex[old]
        self.ifindex[index] = name
        self._cmsg[name] = [source_cmsg(link.address, index)]
        log.info("client interface has a new index", interface=name, index=index)
        return name

    def _from_local(self, payload: bytes, source: int | None) -> None:
        """A reply for us that the DHCP server of this process made (``source`` None) or
        received from ``source`` on one of its sockets."""
        if self.agent is None or self.sock is None or not self.relaying:
            return
        outcome = self.agent.from_server(payload, source or 0, local=source is None)
        if outcome.deliver is not None:
            self._deliver(self.sock, outcome.deliver)

    def _deliver(self, sock: socket.socket, deliver: Deliver) -> None:
        address = deliver.address
        arp = deliver.hwaddr is not None and self._set_arp(sock, deliver)
        if deliver.hwaddr is not None and not arp:
            address = BROADCAST
        destination = (
            self._broadcast if address == BROADCAST else (_text(address), self.client_port)
        )
        try:
            sock.sendmsg([deliver.payload], self._cmsg[deliver.interface], 0, destination)
        except OSError as exc:
            self.send_errors += 1
            log.debug("reply not delivered", interface=deliver.interface, error=str(exc))
        if arp:  # the frame has left: the entry would hold a slot of the host's table
            delete_arp_entry(sock, deliver.interface, destination[0])

    def _send(self, sock: socket.socket, payload: bytes, destination: tuple[str, int]) -> None:
        try:
            sock.sendto(payload, destination)
        except OSError as exc:  # a full buffer, an unreachable server: the client retries
            self.send_errors += 1
            log.debug("request not forwarded", server=destination[0], error=str(exc))

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
