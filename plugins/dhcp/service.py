"""The trio shell of the DHCP server: sockets in, the sans-IO server, the state log, sockets out.

Per datagram: read it with its arrival address (``IP_PKTINFO``), hand it to
:class:`~plugins.dhcp.server.DhcpServer`, then either send the replies at once
or, when the outcome changes leases, only after the lease store says the
records **committed** (durable here and acknowledged by the standby: an ACK
is never sent for a lease a crash or a failover could lose). Bursts are
drained without yielding per packet; the state log's group commit batches
their fsyncs and the replication round trips. Replies of the active leave
from the rack's VIP when there is one (``IP_PKTINFO`` on ``sendmsg``).

Roles: the server answers its pools only while the node is active. On an
appliance of a rack, becoming active waits until the lease table has taken in
every record committed before (the changefeed runs first), then this node
announces its server identifiers and imports the journal of an earlier release
if it has one; losing the role stops dynamic answers at once (and the fence
stops every ACK already decided).

Conflict probes (``probe = "icmp"``) run one per address at a time: a DISCOVER
that arrives while its address is being probed takes the place of the one
waiting (the reply answers the newest), and at most :data:`MAX_PROBES` run at
once; past that a DISCOVER that needs a probe is dropped (``probe-busy``) and
its client's retransmission tries again. A DISCOVER storm thus costs a bounded
number of sockets, and no address is offered unprobed for lack of one.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import time
from collections.abc import Callable

import trio

from appliance.logs import get_logger

from .exchangelog import received_fields_untrusted, sent_fields
from .leases import Lease, address_text
from .metrics import DhcpMetrics
from .netio import (
    CMSG_SPACE,
    arrival_address,
    delete_arp_entry,
    icmp_in_use,
    interface_address,
    open_server_socket,
    set_arp_entry,
    set_deaf,
    source_cmsg,
)
from .server import Arrival, DhcpServer, Outcome, Reply
from .store import LeaseStore, NotWriter

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
        replicated: bool = False,
        name: str = "",
        own_addresses: tuple[int, ...] = (),
        rack_addresses: tuple[int, ...] = (),
        log_exchanges: bool = False,
    ) -> None:
        self.server = server
        self.store = store
        self.interfaces = interfaces
        self.metrics = metrics
        self.events = events
        self.probe_timeout = probe_timeout
        self.clock = clock  # wall time: leases outlive the process
        self.fence = fence  # node.fence.ok: does this node still hold the rack's lease?
        self.replicated = replicated  # an appliance of a rack: others write the log too
        self.name = name  # this node's name, under which it announces its server identifiers
        self.own_addresses = own_addresses  # configured ones; the interfaces' are added at start
        self.rack_addresses = rack_addresses  # the other appliances' as configured ([ha] peers)
        self.log_exchanges = log_exchanges  # a line per message received and sent ([node])
        self._want_active = server.active
        self._role_changed = trio.Event()
        self._import: tuple[trio.Event, trio.Event] | None = None  # (done, imported)
        self._cmsgs: dict[int, list[tuple[int, int, bytes]]] = {}  # source -> IP_PKTINFO
        self.sockets: dict[str, socket.socket] = {}
        self._nursery: trio.Nursery | None = None
        self._probing: dict[int, tuple[bytes, Arrival]] = {}  # address -> newest DISCOVER
        self.l2_unicast = True  # until the kernel refuses us ARP entries
        self._deaf = False  # the sockets drop everything (a standby with nothing to answer)
        self._arp_refused = False  # the last ARP entry failed (logged once per episode)
        # A relay agent in this process (plugins/relay): its giaddrs and where its replies go
        self._relay_owns: Callable[[int], bool] | None = None
        self._relay_deliver: Callable[[bytes, int | None], None] = lambda payload, source: None

    async def run(self, node=None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self.store.load_legacy)
        try:
            for interface in self.interfaces:
                self.sockets[interface] = open_server_socket(
                    interface, self.server.config.server_port
                )
            addresses = {a for a in map(interface_address, self.interfaces) if a}
            self.own_addresses = tuple(sorted(addresses | set(self.own_addresses)))
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.store.follow)
                nursery.start_soon(self.store.follow_servers, self._servers_changed)
                nursery.start_soon(self._sweep)
                nursery.start_soon(self._roles)
                if self._want_active:
                    self.server.active = False
                    self.set_active(True)
                self._hear()
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
            if data[:1] == b"\x02" and self._relay_owns is not None:  # a reply: a relay's?
                self._to_relay(data, _address(source[0]))
                continue
            found = arrival_address(ancdata)
            local = found[1] if found else fallback
            arrival = Arrival(interface, local, source, loopback)
            self._dispatch(data, arrival, self.server.handle(data, arrival, self.clock()))
        return False

    # -- a relay agent in this process (plugins/relay/hookspecs.py: LocalServer) --------------

    def serves(self, address: int) -> bool:
        """Does this server answer at ``address`` now: the rack's VIP while active, an
        address of its interfaces (a relay in this process hands such requests over)."""
        vip = self.server.config.vip
        return (
            bool(self.sockets)
            and self.server.active
            and (address in self.own_addresses or (vip is not None and int(vip) == address))
        )

    def inject(self, payload: bytes, address: int) -> None:
        """A request a relay of this process sent to ``address``, handled as if it had
        come in there (its replies go to the relay's ``giaddr``: back to the relay)."""
        interface = next(iter(self.sockets))  # a relayed reply never uses its socket
        arrival = Arrival(
            interface, address, (address_text(address), self.server.config.server_port)
        )
        self._dispatch(payload, arrival, self.server.handle(payload, arrival, self.clock()))

    def attach_relay(self, owns: Callable[[int], bool],
                     deliver: Callable[[bytes, int | None], None]) -> None:  # fmt: skip
        self._relay_owns, self._relay_deliver = owns, deliver
        self._hear()  # a standby's sockets carry the relay's replies too: never deaf

    def _to_relay(self, payload: bytes, source: int | None) -> None:
        """A reply for the relay of this process: ``source`` None for our own."""
        giaddr = int.from_bytes(payload[24:28], "big")
        if self._relay_owns is None or not self._relay_owns(giaddr):
            self.metrics.count(Outcome(dropped="not-a-request"), received=source is not None)
            return
        try:
            self._relay_deliver(payload, source)
        except Exception as exc:  # the relay's bug must not stop the server
            log.error("relay hand-over failed", error=f"{type(exc).__name__}: {exc}")

    def _dispatch(self, data: bytes, arrival: Arrival, outcome: Outcome, *, again=False) -> None:
        self.metrics.count(outcome, received=not again)
        if self.log_exchanges and not again:
            self._log_received(data, arrival, outcome)
        if outcome.probe is not None:
            self._start_probe(data, arrival, outcome.probe)
        elif outcome.commits:
            # Decided while active (a standby decides no commits). The state log asks the
            # fence at the append: once the lease is gone, nothing is written.
            commits, replies = outcome.commits, outcome.replies
            self._commit(commits, lambda: self._durable(commits, replies))
        else:
            self._send(outcome.replies, self.server.active)

    def _log_received(self, data: bytes, arrival: Arrival, outcome: Outcome) -> None:
        fields = received_fields_untrusted(data, arrival.interface, arrival.source[0])
        if outcome.dropped is not None:
            fields["ignored"] = outcome.dropped
        elif outcome.probe is not None:
            fields["probing"] = address_text(outcome.probe)
        log.info("dhcp received", **fields)

    def _log_sent(self, reply: Reply, destination: str) -> None:
        log.info("dhcp sent", **sent_fields(reply.payload, reply.interface, destination))

    def _commit(self, commits: list[Lease], on_durable: Callable[[], object] | None = None) -> None:
        try:
            self.store.commit(commits, on_durable, self._fenced if on_durable else None)
        except NotWriter:
            self._fenced()

    def _fenced(self) -> None:
        """A decision of the active that will not be answered: the rack's lease is gone
        (before its record was appended, or before it committed)."""
        self.metrics.count(Outcome(dropped="fenced"), received=False)

    def _durable(self, commits: list[Lease], replies: list[Reply]) -> None:
        if not self._send(replies, True):
            # The fence closed after the commit: no ACK went out, so no lease is
            # announced; the client retries at the new active, which has the record.
            return
        # The decision's own lease (a move's release before it is no event of its own).
        try:
            self.events(commits[-1])
        except Exception as exc:  # a listener's bug must not stop the server
            log.error("lease event hook failed", error=f"{type(exc).__name__}: {exc}")

    def _send(self, replies: list[Reply], fenced: bool = False) -> bool:
        """``fenced``: decided while active, so sent only while the lease still holds.
        False when the fence refused."""
        if fenced and replies and not self.fence():
            self.metrics.count(Outcome(dropped="fenced"), received=False)
            return False
        for reply in replies:
            if self._relay_owns is not None and self._relay_owns(_address(reply.address)):
                self._to_relay(reply.payload, None)  # a relay of this process: no socket
                self.metrics.sent(reply.kind)
                if self.log_exchanges:
                    self._log_sent(reply, "relay in this process")
                continue
            sock = self.sockets[reply.interface]
            address = reply.address
            arp = (
                reply.hwaddr is not None
                and self.l2_unicast
                and self._set_arp(sock, reply.interface, address, reply.hwaddr)
            )
            if reply.hwaddr is not None and not arp:
                address = "255.255.255.255"
            try:
                if reply.source:
                    self._send_from(sock, reply, address)
                else:
                    sock.sendto(reply.payload, (address, reply.port))
            except OSError as exc:  # full buffer, unreachable relay: the client retries
                self.metrics.send_failed(exc)
                continue
            finally:
                if arp:  # the frame has left: the entry would hold a slot of the host's table
                    delete_arp_entry(sock, reply.interface, address)
            self.metrics.sent(reply.kind)
            if self.log_exchanges:
                self._log_sent(reply, f"{address}:{reply.port}")
        return True

    def _send_from(self, sock: socket.socket, reply: Reply, address: str) -> None:
        """Send from ``reply.source`` (the VIP). Just after the lease was granted the VIP
        guard may not have added it yet (the kernel says EINVAL): the reply then leaves
        from the interface's own address; it names the VIP all the same."""
        cmsg = self._cmsgs.get(reply.source)
        if cmsg is None:
            cmsg = self._cmsgs[reply.source] = [source_cmsg(reply.source)]
        try:
            sock.sendmsg([reply.payload], cmsg, 0, (address, reply.port))
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EADDRNOTAVAIL):
                raise
            sock.sendto(reply.payload, (address, reply.port))

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
            assert self._nursery is not None  # probes start only while serving
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
            self._commit([quarantine])
        outcome = self.server.handle(data, arrival, now)
        if outcome.probe is None:  # a second probe waits for the client's retransmission
            self._dispatch(data, arrival, outcome, again=True)

    async def _sweep(self) -> None:
        while True:
            await trio.sleep(SWEEP_INTERVAL)
            expired = self.server.sweep(self.clock())  # only while active: else nothing
            if expired:
                self._commit(expired)

    # -- roles ------------------------------------------------------------------------------

    def set_active(self, active: bool) -> None:
        """The node's role changed (``rackboot_role_changed``). Losing it stops dynamic
        answers at once. Taking it: a node alone starts at once (nobody else writes its
        log, and the table was loaded before it served); an appliance of a rack in
        :meth:`_roles`, once the lease table took in what was committed before."""
        self._want_active = active
        if not active:
            self.server.active = False
            self._hear()
        elif not self.replicated and not self.server.active:
            self._activate()
        self._role_changed.set()

    def _activate(self) -> None:
        """Announce this node's server identifiers and start importing an old journal (its
        leases pending in the view before the first dynamic answer), then answer."""
        try:
            if self.replicated and self.name:
                self.store.announce(self.name, [address_text(a) for a in self.own_addresses])
            if self.store.legacy is not None and self._import is None:
                done, imported = trio.Event(), trio.Event()

                def durable() -> None:
                    imported.set()
                    done.set()

                if self.store.import_legacy(durable, done.set):
                    self._import = (done, imported)
        except NotWriter:
            pass  # the lease went already: taken up at the next activation
        self.server.active = True
        self._hear()

    def _hear(self) -> None:
        """A node that answers nothing (a standby without reservations, see
        ``answers_as_standby``) is deaf: the kernel drops what reaches its sockets. Reading
        and dropping every broadcast of a busy rack was ~30 % of a standby's busy time
        (bench.dhcp --ha); the first datagram after this node takes over is heard."""
        deaf = (not self.server.active and not self.server.answers_as_standby()
                and self._relay_owns is None)  # fmt: skip
        if deaf == self._deaf:
            return
        self._deaf = deaf
        for interface, sock in self.sockets.items():
            try:
                set_deaf(sock, deaf)
            except OSError as exc:  # no socket filters here: it hears and drops, as before
                log.warning("dhcp socket filter refused", interface=interface, error=str(exc))

    async def _roles(self) -> None:
        while True:
            await self._role_changed.wait()
            self._role_changed = trio.Event()
            if self._want_active and not self.server.active:
                # Records the old active wrote commit here before this node is elected, and
                # each commit wakes the changefeed; trio runs every task made runnable before
                # this one yields ahead of its return, so after these checkpoints the table
                # holds every record committed before the role changed.
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
                if not self._want_active or self.server.active:
                    continue
                self._activate()
                log.info("dhcp answering the pools", leases=len(self.server.leases.table),
                         lsn=self.server.leases.table.lsn)  # fmt: skip
            if self._import is not None:
                done, imported = self._import
                await done.wait()
                self._import = None
                if imported.is_set():
                    await self.store.retire_legacy()

    def _servers_changed(self, servers: dict) -> None:
        """The rack's appliances' identifiers, as announced, plus this node's own."""
        aliases = set(self.own_addresses)
        for addresses in servers.values():
            if isinstance(addresses, list):
                for text in addresses:
                    try:
                        aliases.add(int(ipaddress.IPv4Address(text)))
                    except ValueError:
                        continue
        self.server.aliases = aliases | set(self.rack_addresses)


def _address(text: str) -> int:
    return int.from_bytes(socket.inet_aton(text), "big")
