"""The trio shell of the DHCP server: sockets in, the sans-IO server, the journal, sockets out.

Per datagram: read it with its arrival address (``IP_PKTINFO``), hand it to
:class:`~plugins.dhcp.server.DhcpServer`, then either send the replies at once
or, when the outcome changes leases, only after the lease store says the
records are durable (an ACK is never sent for a lease a crash could lose).
Bursts are drained without yielding per packet; the group commit batches
their fsyncs.

Conflict probes (``probe = "icmp"``) run one per address at a time: a DISCOVER
that arrives while its address is being probed takes the place of the one
waiting (the reply answers the newest), and at most :data:`MAX_PROBES` run at
once; past that a DISCOVER that needs a probe is dropped (``probe-busy``) and
its client's retransmission tries again. A DISCOVER storm thus costs a bounded
number of sockets, and no address is offered unprobed for lack of one.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import trio

from appliance.logs import get_logger

from .leases import Lease
from .metrics import DhcpMetrics
from .netio import (
    CMSG_SPACE,
    arrival_address,
    icmp_in_use,
    interface_address,
    open_server_socket,
    set_arp_entry,
)
from .server import Arrival, DhcpServer, Outcome, Reply
from .store import LeaseStore

log = get_logger("dhcp")

MAX_DATAGRAM = 65_535
DRAIN_BATCH = 64  # datagrams handled before giving the journal and timers a turn
SWEEP_INTERVAL = 30.0
MAX_PROBES = 64  # conflict probes in flight (each holds a socket); past it: drop "probe-busy"


class DhcpService:
    def __init__(
        self,
        server: DhcpServer,
        store: LeaseStore,
        interfaces: tuple[str, ...],
        metrics: DhcpMetrics,
        *,
        events: Callable[[Lease], None] = lambda lease: None,
        probe_timeout: float = 0.5,
        clock: Callable[[], float] = time.time,
        fence: Callable[[], bool] = lambda: True,
    ) -> None:
        self.server = server
        self.store = store
        self.interfaces = interfaces
        self.metrics = metrics
        self.events = events
        self.probe_timeout = probe_timeout
        self.clock = clock  # wall time: leases outlive the process
        self.fence = fence  # node.fence.ok: does this node still hold the rack's lease?
        self.sockets: dict[str, socket.socket] = {}
        self._nursery: trio.Nursery | None = None
        self._probing: dict[int, tuple[bytes, Arrival]] = {}  # address -> newest DISCOVER
        self.l2_unicast = True  # until the kernel refuses us ARP entries
        self._arp_refused = False  # the last ARP entry failed (logged once per episode)

    async def run(self, node=None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self.store.load)
        try:
            for interface in self.interfaces:
                self.sockets[interface] = open_server_socket(
                    interface, self.server.config.server_port
                )
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.store.run)
                nursery.start_soon(self._sweep)
                for interface, sock in self.sockets.items():
                    nursery.start_soon(self._receive, interface, sock)
                log.info(
                    "dhcp serving",
                    interfaces=",".join(self.interfaces),
                    port=self.server.config.server_port,
                    subnets=",".join(s.key for s in self.server.config.subnets),
                    leases=len(self.server.leases),
                )
                task_status.started()
        finally:
            for sock in self.sockets.values():
                sock.close()

    async def _receive(self, interface: str, sock: socket.socket) -> None:
        loopback = interface == "lo"
        fallback = interface_address(interface)
        while True:
            await trio.lowlevel.wait_readable(sock)
            # After a full batch the journal and timers get a turn, then draining goes
            # on without waiting: wait_readable costs epoll calls and a scheduler round.
            while not self._drain(interface, sock, fallback, loopback):
                await trio.lowlevel.checkpoint()

    def _drain(self, interface: str, sock: socket.socket, fallback: int, loopback: bool) -> bool:
        """Handle up to DRAIN_BATCH datagrams; True when the socket is empty."""
        for _ in range(DRAIN_BATCH):
            try:
                data, ancdata, _flags, source = sock.recvmsg(MAX_DATAGRAM, CMSG_SPACE)
            except BlockingIOError:
                return True
            except OSError as exc:  # e.g. ICMP errors queued on the socket
                log.debug("receive error", interface=interface, error=str(exc))
                continue
            found = arrival_address(ancdata)
            local = found[1] if found else fallback
            arrival = Arrival(interface, local, source, loopback)
            self._dispatch(data, arrival, self.server.handle(data, arrival, self.clock()))
        return False

    def _dispatch(self, data: bytes, arrival: Arrival, outcome: Outcome, *, again=False) -> None:
        self.metrics.count(outcome, received=not again)
        if outcome.probe is not None:
            self._start_probe(data, arrival, outcome.probe)
        elif outcome.commits:
            commits, replies, fenced = outcome.commits, outcome.replies, self.server.active
            if fenced and not self.fence():
                # decided while active, but the lease is gone: nothing is journaled
                self.metrics.count(Outcome(dropped="fenced"), received=False)
                return
            self.store.commit(commits, lambda: self._durable(commits, replies, fenced))
        else:
            self._send(outcome.replies, self.server.active)

    def _durable(self, commits: list[Lease], replies: list[Reply], fenced: bool) -> None:
        if not self._send(replies, fenced):
            # The fence closed during the group commit: the record is on disk but no ACK
            # went out, so no lease is announced; the client retries at the new active.
            return
        for lease in commits:
            try:
                self.events(lease)
            except Exception as exc:  # a listener's bug must not stop the server
                log.error("lease event hook failed", error=f"{type(exc).__name__}: {exc}")

    def _send(self, replies: list[Reply], fenced: bool = False) -> bool:
        """``fenced``: decided while active, so sent only while the lease still holds.
        False when the fence refused."""
        if fenced and replies and not self.fence():
            self.metrics.count(Outcome(dropped="fenced"), received=False)
            return False
        for reply in replies:
            sock = self.sockets[reply.interface]
            address = reply.address
            if reply.hwaddr is not None and not (
                self.l2_unicast and self._set_arp(sock, reply.interface, address, reply.hwaddr)
            ):
                address = "255.255.255.255"
            try:
                sock.sendto(reply.payload, (address, reply.port))
            except OSError as exc:  # full buffer, unreachable relay: the client retries
                self.metrics.send_failed(exc)
                continue
            self.metrics.sent(reply.kind)
        return True

    def _set_arp(self, sock: socket.socket, interface: str, address: str, hwaddr: bytes) -> bool:
        """Make ``address`` resolve to ``hwaddr``; False: broadcast this reply instead."""
        try:
            done = set_arp_entry(sock, interface, address, hwaddr)
        except OSError as exc:  # e.g. ENOBUFS: the neighbour table is full (a DISCOVER storm)
            self.metrics.l2_fallback(exc)
            if not self._arp_refused:
                self._arp_refused = True
                log.warning(
                    "kernel refused an ARP entry: replying by broadcast until it accepts again",
                    address=address,
                    error=str(exc),
                )
            return False
        if done:
            if self._arp_refused:
                self._arp_refused = False
                log.info("ARP entries accepted again: replying by unicast")
            return True
        self.l2_unicast = False
        log.warning("cannot set ARP entries (needs CAP_NET_ADMIN): replying by broadcast")
        return False

    def _start_probe(self, data: bytes, arrival: Arrival, address: int) -> None:
        if address in self._probing:  # its client asked again: answer the newest message
            self._probing[address] = (data, arrival)
            self.metrics.count(Outcome(dropped="probe-pending"), received=False)
        elif len(self._probing) >= MAX_PROBES:
            self.metrics.count(Outcome(dropped="probe-busy"), received=False)
        else:
            self._probing[address] = (data, arrival)
            self._nursery.start_soon(self._probe_then_handle, address)

    async def _probe_then_handle(self, address: int) -> None:
        text = socket.inet_ntoa(address.to_bytes(4, "big"))
        try:
            in_use = await icmp_in_use(text, self.probe_timeout)
        except OSError as exc:
            log.warning("conflict probe failed; offering without it", address=text, error=str(exc))
            in_use = False
        finally:
            data, arrival = self._probing.pop(address)
        self.metrics.probed(in_use)
        now = self.clock()
        quarantine = self.server.probe_result(address, in_use, now)
        if quarantine is not None:
            log.warning("address in use by an unknown host: quarantined", address=text)
            self.store.commit([quarantine])
        outcome = self.server.handle(data, arrival, now)
        if outcome.probe is None:  # a second probe waits for the client's retransmission
            self._dispatch(data, arrival, outcome, again=True)

    async def _sweep(self) -> None:
        while True:
            await trio.sleep(SWEEP_INTERVAL)
            self.server.sweep(self.clock())
