"""The DHCPv4 server as a sans-IO machine (RFC 2131): bytes and ``now`` in, replies out.

:meth:`DhcpServer.handle` takes one datagram with where it arrived and the
wall-clock time, and returns an :class:`Outcome`: the replies to send, the
lease records to make durable *before* sending them, or why it was dropped.
The trio shell (plugins/dhcp/service.py) owns sockets, the journal and time.

Decisions worth knowing:

* Offers are held in memory for ``offer_hold`` seconds, not persisted: a lost
  offer costs the client one retransmission, never a wrong address.
* Leases are read through a :class:`~plugins.dhcp.leases.LeaseView`: the
  committed table (fed by the state log's changefeed) with this server's own
  decisions laid over it until their records commit. A decision that changes
  a lease goes into that overlay at once and out in :attr:`Outcome.commits`;
  the shell appends the records and tells the view when each committed (or
  was abandoned because the rack's lease was lost first).
* A returning client gets its previous address back while nobody else holds
  it; new clients get addresses never leased before, then the longest-free ones.
* REQUEST in INIT-REBOOT, RENEWING or REBINDING for an address the server
  does not own is NAKed only when the address is in one of its subnets and
  ``authoritative`` is set; otherwise the server stays silent (RFC 2131 §4.3.2).
* Relayed messages (``giaddr`` set) choose their subnet by RFC 3527 link
  selection (option 82 sub-option 5), else RFC 3011 option 118, else ``giaddr``;
  replies go to the relay's server port and option 82 is echoed unchanged.
* The server identifier is the rack's virtual IP when there is one
  (``ServerConfig.vip``), and replies from the active leave from it
  (:attr:`Reply.source`). A standby answers nothing dynamic and writes
  nothing; it answers reservations and INFORM only when its answer is the
  active's (the VIP as server identifier), else it stays silent.
* A SELECTING REQUEST naming another appliance of this rack (:attr:`DhcpServer.aliases`:
  an offer made before a failover, or under an older configuration) is the
  rack's to answer: see :meth:`DhcpServer._request`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from ipaddress import IPv4Address
from typing import NamedTuple

from .boot import BootChoice, BootRequest, choose_boot
from .codec import (
    BOOTREPLY,
    BOOTREQUEST,
    BROADCAST_FLAG,
    MalformedPacket,
    Message,
    build,
    build_prepared,
    option_block,
    parse_untrusted,
)
from .leases import Lease, LeaseState, LeaseTable, LeaseView
from .model import Reservation, ServerConfig, Subnet
from .options import (
    EncodeError,
    MessageType,
    Opt,
    encode_ip,
    encode_ips,
    encode_routes,
    encode_str,
    encode_u16,
    encode_u32,
)

BROADCAST = "255.255.255.255"
MAX_HOSTNAME = 63
PROBE_VALID = 60.0  # seconds a clean probe of an address is trusted

# Fetched once: on Python 3.11 an enum attribute lookup (Opt.SERVER_ID) costs ~0.1 µs,
# and the reply path makes dozens of them per packet.
_OFFER, _ACK, _NAK = MessageType.OFFER, MessageType.ACK, MessageType.NAK
_BOUND = LeaseState.BOUND
_MESSAGE_TYPE, _SERVER_ID = int(Opt.MESSAGE_TYPE), int(Opt.SERVER_ID)
_REQUESTED_IP, _CLIENT_ID = int(Opt.REQUESTED_IP), int(Opt.CLIENT_ID)
_RELAY_AGENT_INFO, _USER_CLASS = int(Opt.RELAY_AGENT_INFO), int(Opt.USER_CLASS)
_SUBNET_SELECTION, _VENDOR_CLASS = int(Opt.SUBNET_SELECTION), int(Opt.VENDOR_CLASS)
_KIND_OPTION = {kind: bytes([kind]) for kind in MessageType}  # option 53 values
_ZERO = IPv4Address(0)
RELAY_CACHE = 1024  # relays' addresses whose subnet is remembered
EXPIRE_BATCH = 4096  # expiry records one sweep writes at most (the rest: next sweep)


class Arrival(NamedTuple):
    """Where a datagram came in (from ``IP_PKTINFO`` and ``recvmsg``).

    A named tuple rather than a frozen dataclass: one is made per datagram, and
    it builds in a quarter of the time.
    """

    interface: str
    local: int  # our address on that interface (the reply source, the server identifier)
    source: tuple[str, int]
    loopback: bool = False  # development: replies go back to the sender


@dataclass(slots=True)
class Reply:
    payload: bytes
    address: str  # IP destination
    port: int
    interface: str
    hwaddr: bytes | None = None  # deliver at L2 to this MAC: the client has no address yet
    kind: MessageType = MessageType.ACK
    source: int = 0  # send from this address (the rack's VIP); 0: as the kernel chooses


@dataclass(slots=True)
class Outcome:
    received: MessageType | None = None
    replies: list[Reply] = field(default_factory=list)
    # Records to commit before the replies go out; already in the server's view (pending).
    commits: list[Lease] = field(default_factory=list)
    dropped: str | None = None  # why nothing was sent, for the drop counters
    probe: int | None = None  # probe this address, then call probe_result and handle again


class Policy:
    """Extension points, wired to the plugin hooks by the shell. Defaults change nothing."""

    def host(self, mac: str, client_id: bytes | None) -> Reservation | None:
        return None

    def looks_up_hosts(self) -> bool:
        """May :meth:`host` name a reservation? If not, the server does not ask it (nor
        format the MAC for it). True whenever a subclass overrides :meth:`host`, unless it
        says otherwise."""
        return type(self).host is not Policy.host

    def boot(self, request: BootRequest, default: BootChoice | None) -> BootChoice | None:
        return default

    def boots_any_client(self) -> bool:
        """May :meth:`boot` answer a client that does not ask to boot? If not, the server
        skips building its :class:`BootRequest` (~2 µs a packet). True whenever a
        subclass overrides :meth:`boot`, unless it says otherwise."""
        return type(self).boot is not Policy.boot

    def reply_options(self, request: Message, reply: Message, lease: Lease | None) -> None:
        pass

    def alters_replies(self) -> bool:
        """May :meth:`reply_options` change a reply? If not, the common replies are made
        from pre-encoded option blocks, without a :class:`Message` to show it. True
        whenever a subclass overrides :meth:`reply_options`, unless it says otherwise."""
        return type(self).reply_options is not Policy.reply_options


class DhcpServer:
    def __init__(
        self,
        config: ServerConfig,
        leases: LeaseTable | LeaseView | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.config = config
        self.leases = leases if isinstance(leases, LeaseView) else LeaseView(leases)
        self.policy = policy or Policy()
        self.active = True  # False on a standby node: no dynamic answers, nothing written
        self._vip = int(config.vip) if config.vip is not None else 0
        # Server identifiers of this rack's appliances other than our own (their own
        # addresses, named by offers made before a failover or under an older configuration).
        self.aliases: set[int] = set()
        self._offers: dict[int, tuple[bytes, float]] = {}  # address -> (client, held until)
        self._offer_of: dict[bytes, int] = {}  # client -> offered address
        self._probed: dict[int, float] = {}  # address -> probed free, trusted until
        self._by_mac = {r.mac: r for r in config.reservations if r.mac}
        self._by_client_id = {r.client_id: r for r in config.reservations if r.client_id}
        self._reserved = {r.address for r in config.reservations}
        self._cursor = {s.key: _PoolCursor(s) for s in config.subnets}
        self._static = {s.key: _subnet_options(s, config) for s in config.subnets}
        self._lease_options = {s.key: _lease_options(s, config) for s in config.subnets}
        self._subnet_cache: dict[tuple[str, int], Subnet | None] = {}
        self._relay_subnets: dict[int, Subnet | None] = {}  # giaddr -> its subnet
        # (subnet, kind, server identifier, leased) -> option_block() of _options(), or None
        self._blocks: dict[tuple[str, MessageType, int, bool], bytes | None] = {}
        self.prepared_replies = True  # False: every reply through build() (tests compare)

    # -- the entry point ----------------------------------------------------

    def handle(self, data: bytes, arrival: Arrival, now: float) -> Outcome:
        try:
            msg = parse_untrusted(data)
        except MalformedPacket as exc:
            return Outcome(dropped=f"malformed:{exc.reason}")
        kind = msg.message_type
        if msg.op != BOOTREQUEST:
            return Outcome(kind, dropped="not-a-request")
        if kind is None:
            return Outcome(dropped="bootp")
        handler = _HANDLERS.get(kind)
        if handler is None:
            return Outcome(kind, dropped="unhandled-type")
        subnet = self._subnet_for(msg, arrival)
        if subnet is None:
            return Outcome(kind, dropped="no-subnet")
        outcome = handler(self, msg, arrival, subnet, now)
        outcome.received = kind
        return outcome

    def answers_as_standby(self) -> bool:
        """Can a standby answer anything? Only a reservation's answer (identical to the
        active's: the VIP as server identifier) and an INFORM's, so only with a VIP; and
        with no reservation configured nor a host hook to name one, the INFORMs are left
        to the active and the standby answers nothing at all (its shell need not listen)."""
        return bool(self._vip) and bool(self.config.reservations or self.policy.looks_up_hosts())

    def probe_result(self, address: int, in_use: bool, now: float) -> Lease | None:
        """After ``Outcome.probe``: a clean probe is trusted a while; an answered one
        quarantines the address (the returned record is to be made durable)."""
        if not in_use:
            self._probed[address] = now + PROBE_VALID
            return None
        subnet = next((s for s in self.config.subnets if s.contains(address)), None)
        quarantine = Lease(
            address, b"", b"", subnet.key if subnet else "", LeaseState.DECLINED,
            now, now + self.config.decline_quarantine, "conflict",
        )  # fmt: skip
        self.leases.add(quarantine)
        return quarantine

    def sweep(self, now: float, limit: int = EXPIRE_BATCH) -> list[Lease]:
        """Forget stale offers and probes; on the active, the records saying which bound
        leases ended (at most ``limit``, pending like any decision, to be committed)."""
        for address, (client, until) in list(self._offers.items()):
            if until <= now:
                self._drop_offer(address, client)
        for address, until in list(self._probed.items()):
            if until <= now:
                del self._probed[address]
        if not self.active:
            return []  # a standby writes nothing: an ended lease is free all the same
        expired = self.leases.expired(now, limit)
        for lease in expired:
            self.leases.add(lease)
        return expired

    def pool_usage(self, now: float) -> dict[str, tuple[int, int]]:
        """Per subnet: (addresses in use, pool size). O(leases); for metrics scrapes."""
        used: dict[str, int] = {s.key: 0 for s in self.config.subnets}
        for lease in self.leases:
            if lease.subnet in used and lease.active(now):
                used[lease.subnet] += 1
        return {s.key: (used[s.key], s.pool_size) for s in self.config.subnets}

    # -- message handlers -------------------------------------------------------

    def _discover(self, msg: Message, arrival: Arrival, subnet: Subnet, now: float) -> Outcome:
        client = _client_key(msg)
        reservation = self._reservation(msg, client, subnet)
        if reservation is not None:
            if not self.active and not self._vip:
                return Outcome(dropped="standby")  # our answer would not be the active's
            address = reservation.address
            if not self.leases.is_free_for(address, client, now):
                return Outcome(dropped="reserved-address-taken")
        elif not self.active:
            return Outcome(dropped="standby")
        else:
            allocated = self._allocate(msg, client, subnet, now)
            if allocated is None:
                return Outcome(dropped="pool-exhausted")
            address = allocated
        self._offers[address] = (client, now + self.config.offer_hold)
        self._offer_of[client] = address
        if reservation is None and self.config.probe and self._needs_probe(address, client, now):
            return Outcome(probe=address)  # held for this client while the shell probes
        reply = self._reply(msg, arrival, subnet, _OFFER, address, reservation, now)
        return Outcome(replies=[reply])

    def _request(self, msg: Message, arrival: Arrival, subnet: Subnet, now: float) -> Outcome:
        client = _client_key(msg)
        server_id = _option_ip(msg, _SERVER_ID)
        requested = _option_ip(msg, _REQUESTED_IP)
        ciaddr = int(msg.ciaddr)
        named = 0  # the server identifier to answer with, when not our own
        if server_id is not None:  # SELECTING: the client answers someone's offer
            if server_id != self._server_id(arrival):
                if server_id not in self.aliases:
                    self._forget_offer_of(client)
                    return Outcome(dropped="chose-another-server")
                # The client selected an offer of another appliance of this rack, made
                # before a failover (or under an older configuration naming it): the rack
                # is the selected server, and it answers rather than leave the client to
                # time out. RFC 2131 §4.3.2 (and §3.1 step 4): the selected server commits
                # the binding and ACKs, or, "unable to satisfy the DHCPREQUEST", SHOULD
                # NAK. This node knows no offer of another node, only committed leases:
                # it ACKs when the client's lease of that address is in the table (the
                # binding was committed; the client missed the ACK), and NAKs otherwise,
                # so the client starts over at once and gets an offer naming the rack's
                # server identifier. Both carry the identifier the client named: clients
                # take an answer only from the server they selected (iPXE drops an ACK,
                # busybox udhcpc a NAK, with another one). A standby answers nothing.
                if not self.active:
                    return Outcome(dropped="standby")
                named = server_id
                held = self.leases.get(requested) if requested is not None else None
                if not (held is not None and held.client == client and held.state is _BOUND):
                    self._forget_offer_of(client)
                    return self._refuse(
                        msg, arrival, "offered-by-another-appliance", always=True, server_id=named
                    )
            if requested is None:
                return Outcome(dropped="selecting-without-address")
            address = requested
        elif requested is not None and ciaddr == 0:  # INIT-REBOOT
            address = requested
        elif ciaddr:  # RENEWING (unicast) or REBINDING (broadcast)
            address = ciaddr
        else:
            return Outcome(dropped="request-without-address")

        reservation = self._reservation(msg, client, subnet)
        if not self.active and (reservation is None or not self._vip):
            return Outcome(dropped="standby")  # dynamic, or our answer would not be the active's
        if not subnet.contains(address):
            return self._refuse(msg, arrival, "wrong-network", always=True, server_id=named)
        if reservation is not None and reservation.address != address:
            return self._refuse(
                msg, arrival, "not-the-reserved-address", always=True, server_id=named
            )
        if not self.leases.is_free_for(address, client, now) or self._offered_to_other(
            address, client, now
        ):
            return self._refuse(msg, arrival, "address-taken", always=True, server_id=named)
        if reservation is None:
            lease = self.leases.get(address)
            ours = lease is not None and lease.client == client
            if not (ours or subnet.in_pool(address)) or address in self._reserved:
                return self._refuse(msg, arrival, "not-ours", always=False, server_id=named)
        lease_time = subnet.lease_time or self.config.lease_time
        lease = Lease(
            address, client, msg.chaddr[: msg.hlen], subnet.key, LeaseState.BOUND,
            now, now + lease_time, _hostname(msg, reservation),
        )  # fmt: skip
        self._forget_offer_of(client)
        reply = self._reply(msg, arrival, subnet, _ACK, address, reservation, now, lease, named)
        if not self.active:
            # A standby's answer for a reservation: the active's own, and nothing written
            # (the active, if it is up, commits the same lease).
            return Outcome(replies=[reply])
        commits = [lease]
        previous = self.leases.of_client(client)
        if previous is not None and previous.address != address and previous.state is _BOUND:
            # A client holds one address: moving it releases the other, said by a record
            # of its own (a table rebuilt from the state's snapshot derives nothing).
            commits.insert(0, replace(previous, state=LeaseState.RELEASED))
        for record in commits:
            self.leases.add(record)
        return Outcome(replies=[reply], commits=commits)

    def _decline(self, msg: Message, arrival: Arrival, subnet: Subnet, now: float) -> Outcome:
        client = _client_key(msg)
        requested = msg.requested_ip
        if requested is None or (msg.server_id and not self._names_us(int(msg.server_id), arrival)):
            return Outcome(dropped="not-for-us")
        if not self.active:
            return Outcome(dropped="standby")
        lease = self.leases.get(int(requested))
        if lease is None or lease.client != client:
            return Outcome(dropped="decline-of-unknown-lease")
        quarantine = Lease(
            lease.address, client, lease.hwaddr, lease.subnet, LeaseState.DECLINED,
            now, now + self.config.decline_quarantine, lease.hostname,
        )  # fmt: skip
        self.leases.add(quarantine)
        return Outcome(commits=[quarantine])

    def _release(self, msg: Message, arrival: Arrival, subnet: Subnet, now: float) -> Outcome:
        if not self.active:
            return Outcome(dropped="standby")
        client = _client_key(msg)
        lease = self.leases.get(int(msg.ciaddr))
        if lease is None or lease.client != client or lease.state is not LeaseState.BOUND:
            return Outcome(dropped="release-of-unknown-lease")
        released = Lease(
            lease.address, client, lease.hwaddr, lease.subnet, LeaseState.RELEASED,
            lease.starts, now, lease.hostname,
        )  # fmt: skip
        self.leases.add(released)
        return Outcome(commits=[released])

    def _inform(self, msg: Message, arrival: Arrival, subnet: Subnet, now: float) -> Outcome:
        if not int(msg.ciaddr):
            return Outcome(dropped="inform-without-ciaddr")
        if not self.active and not self._vip:
            return Outcome(dropped="standby")  # our answer would not be the active's
        reservation = self._reservation(msg, _client_key(msg), subnet)
        return Outcome(
            replies=[self._reply(msg, arrival, subnet, MessageType.ACK, 0, reservation, now)]
        )

    # -- choosing -------------------------------------------------------------

    def _subnet_for(self, msg: Message, arrival: Arrival) -> Subnet | None:
        giaddr = int(msg.giaddr)
        if giaddr:
            options = msg.options
            if _RELAY_AGENT_INFO not in options and _SUBNET_SELECTION not in options:
                cache = self._relay_subnets  # giaddr comes from the network: bounded
                if giaddr not in cache:
                    if len(cache) >= RELAY_CACHE:
                        cache.clear()
                    cache[giaddr] = self._subnet_containing(giaddr, "")
                return cache[giaddr]
            link = _link_selection(msg.relay_agent_info) or msg.subnet_selection or msg.giaddr
            return self._subnet_containing(int(link), "")
        key = (arrival.interface, arrival.local)
        if key not in self._subnet_cache:
            self._subnet_cache[key] = self._subnet_containing(arrival.local, arrival.interface)
        return self._subnet_cache[key]

    def _subnet_containing(self, address: int, interface: str) -> Subnet | None:
        for subnet in self.config.subnets:
            if subnet.interface and interface and subnet.interface != interface:
                continue
            if subnet.contains(address):
                return subnet
        return None

    def _reservation(self, msg: Message, client: bytes, subnet: Subnet) -> Reservation | None:
        reservation = None
        client_id = msg.options.get(_CLIENT_ID)
        if client_id is not None:
            reservation = self._by_client_id.get(client_id)
        if reservation is None and msg.htype == 1 and msg.hlen == 6:
            reservation = self._by_mac.get(msg.chaddr[:6])
        if reservation is None and self.policy.looks_up_hosts():
            reservation = self.policy.host(msg.mac or "", client_id)
        if reservation is not None and not subnet.contains(reservation.address):
            return None  # reserved on another link: serve it dynamically here
        return reservation

    def _allocate(self, msg: Message, client: bytes, subnet: Subnet, now: float) -> int | None:
        def usable(address: int) -> bool:
            return (
                subnet.in_pool(address)
                and address not in self._reserved
                and self.leases.is_free_for(address, client, now)
                and not self._offered_to_other(address, client, now)
            )

        offered = self._offer_of.get(client)
        if offered is not None and usable(offered):
            return offered
        previous = self.leases.of_client(client)
        if previous is not None and previous.subnet == subnet.key and usable(previous.address):
            return previous.address
        requested = _option_ip(msg, _REQUESTED_IP)
        if requested is not None and usable(requested):
            return requested
        return self._cursor[subnet.key].next_free(
            lambda a: self.leases.get(a) is None and usable(a), usable
        )

    def _needs_probe(self, address: int, client: bytes, now: float) -> bool:
        lease = self.leases.get(address)
        if lease is not None and lease.client == client:
            return False
        return self._probed.get(address, 0.0) <= now

    def _offered_to_other(self, address: int, client: bytes, now: float) -> bool:
        held = self._offers.get(address)
        return held is not None and held[0] != client and held[1] > now

    def _forget_offer_of(self, client: bytes) -> None:
        address = self._offer_of.get(client)
        if address is not None:
            self._drop_offer(address, client)

    def _drop_offer(self, address: int, client: bytes) -> None:
        if self._offers.get(address, (None,))[0] == client:
            del self._offers[address]
        if self._offer_of.get(client) == address:
            del self._offer_of[client]

    def _server_id(self, arrival: Arrival) -> int:
        """Option 54: the rack's VIP, else ``server_address``, else the arrival address."""
        if self._vip:
            return self._vip
        configured = self.config.server_address
        return int(configured) if configured is not None else arrival.local

    def _names_us(self, server_id: int, arrival: Arrival) -> bool:
        return server_id == self._server_id(arrival) or server_id in self.aliases

    def _source(self) -> int:
        """Where replies leave from: the VIP while this node holds it (the active)."""
        return self._vip if self.active else 0

    # -- replying ---------------------------------------------------------------

    def _refuse(
        self, msg: Message, arrival: Arrival, reason: str, *, always: bool, server_id: int = 0
    ) -> Outcome:
        """NAK a REQUEST we cannot grant: always in SELECTING (the client chose
        us) or when it is on the wrong network; otherwise only if authoritative."""
        if always or msg.server_id is not None or self.config.authoritative:
            return Outcome(replies=[self._nak(msg, arrival, reason, server_id)])
        return Outcome(dropped=reason)

    def _nak(self, msg: Message, arrival: Arrival, reason: str, server_id: int = 0) -> Reply:
        options: dict[int, bytes] = {
            Opt.MESSAGE_TYPE: bytes([MessageType.NAK]),
            Opt.SERVER_ID: encode_u32(server_id or self._server_id(arrival)),
            Opt.MESSAGE: encode_str(reason),
        }
        if msg.relay_agent_info is not None:
            options[Opt.RELAY_AGENT_INFO] = msg.relay_agent_info
        flags = msg.flags | BROADCAST_FLAG if int(msg.giaddr) else msg.flags
        reply = Message(
            BOOTREPLY, msg.htype, msg.hlen, 0, msg.xid, 0, flags,
            giaddr=msg.giaddr, chaddr=msg.chaddr, options=options,
        )  # fmt: skip
        payload = build(reply, max_size=msg.max_message_size or 576)
        address, port, hwaddr = self._destination(msg, arrival, 0, nak=True)
        return Reply(
            payload, address, port, arrival.interface, hwaddr, MessageType.NAK, self._source()
        )

    def _reply(
        self,
        msg: Message,
        arrival: Arrival,
        subnet: Subnet,
        kind: MessageType,
        address: int,
        reservation: Reservation | None,
        now: float,
        lease: Lease | None = None,
        named: int = 0,
    ) -> Reply:
        """``named``: answer with this server identifier (one of the rack's, the client's
        choice) rather than our own; the boot server stays ours."""
        server_id = self._server_id(arrival)
        boot = self._boot(msg, subnet, server_id, reservation)
        payload = None
        if (
            boot is None
            and (reservation is None or not reservation.hostname)
            and self.prepared_replies
            and not self.policy.alters_replies()
        ):
            payload = self._prepared(msg, subnet, kind, address, named or server_id)
        if payload is None:
            payload = self._built(
                msg, subnet, kind, address, reservation, lease, named or server_id, boot
            )
        destination, port, hwaddr = self._destination(msg, arrival, address, nak=False)
        return Reply(payload, destination, port, arrival.interface, hwaddr, kind, self._source())

    def _options(
        self, subnet: Subnet, kind: MessageType, server_id: int, leased: bool
    ) -> dict[int, bytes]:
        """53, 54, the lease's 51, 58, 59 (an OFFER or the ACK of a lease, not an INFORM's),
        then the subnet's options: what every such reply carries."""
        options: dict[int, bytes] = {
            _MESSAGE_TYPE: _KIND_OPTION[kind],
            _SERVER_ID: encode_u32(server_id),
        }
        if leased:
            options.update(self._lease_options[subnet.key])
        options.update(self._static[subnet.key])
        return options

    def _prepared(
        self, msg: Message, subnet: Subnet, kind: MessageType, address: int, server_id: int
    ) -> bytes | None:
        """The common reply (no boot answer, no hostname, no hook adding options) from the
        options block of its subnet, kind and server identifier, encoded once: the same
        bytes as :meth:`_built` (tests/unit/dhcp/test_fast_path.py), or None for it to build."""
        key = (subnet.key, kind, server_id, address != 0)
        block = self._blocks.get(key, b"")
        if block == b"":
            block = self._blocks[key] = option_block(
                self._options(subnet, kind, server_id, address != 0)
            )
        if block is None:
            return None
        relay_agent_info = msg.options.get(_RELAY_AGENT_INFO)
        if relay_agent_info is not None:
            if len(relay_agent_info) > 255:
                return None
            block += bytes((_RELAY_AGENT_INFO, len(relay_agent_info))) + relay_agent_info
        fixed = (
            BOOTREPLY, msg.htype, msg.hlen, 0, msg.xid, 0, msg.flags,
            int(msg.ciaddr) if kind is _ACK else 0, address, 0, int(msg.giaddr), msg.chaddr,
        )  # fmt: skip
        return build_prepared(fixed, block, msg.max_message_size or 576)

    def _built(
        self,
        msg: Message,
        subnet: Subnet,
        kind: MessageType,
        address: int,
        reservation: Reservation | None,
        lease: Lease | None,
        server_id: int,
        boot: BootChoice | None,
    ) -> bytes:
        """Any reply, as a :class:`Message` the hook may change, then :func:`build`."""
        options = self._options(subnet, kind, server_id, address != 0)
        if reservation is not None and reservation.hostname:
            options[Opt.HOSTNAME] = encode_str(reservation.hostname)
        reply = Message(
            BOOTREPLY, msg.htype, msg.hlen, 0, msg.xid, 0, msg.flags,
            msg.ciaddr if kind is _ACK else _ZERO,
            IPv4Address(address), _ZERO, msg.giaddr, msg.chaddr, options=options,
        )  # fmt: skip
        if boot is not None:
            reply.siaddr = boot.server
            options[Opt.TFTP_SERVER_NAME] = encode_str(str(boot.server))
            options[Opt.BOOTFILE_NAME] = encode_str(boot.file)
            if boot.vendor_class:
                options[Opt.VENDOR_CLASS] = boot.vendor_class
            encoded = boot.file.encode()
            if len(encoded) < 128:
                reply.file = encoded
        relay_agent_info = msg.options.get(_RELAY_AGENT_INFO)
        if relay_agent_info is not None:
            options[_RELAY_AGENT_INFO] = relay_agent_info
        self.policy.reply_options(msg, reply, lease)
        try:
            return build(reply, max_size=msg.max_message_size or 576)
        except EncodeError:  # a hook's options did not fit the client's size: fall back
            reply.options = {k: v for k, v in options.items() if k < 224}
            return build(reply, max_size=1500)

    def _boot(
        self,
        msg: Message,
        subnet: Subnet,
        server_id: int,
        reservation: Reservation | None,
    ) -> BootChoice | None:
        vendor = msg.options.get(_VENDOR_CLASS) or b""
        if not vendor.startswith((b"PXEClient", b"HTTPClient")) and _USER_CLASS not in msg.options:
            # An OS client: no boot answer by default, and no request to build for nobody.
            if not self.policy.boots_any_client():
                return None
            return self.policy.boot(_boot_request(msg, subnet), None)
        request = _boot_request(msg, subnet)
        server = subnet.boot_server or self.config.boot_server or IPv4Address(server_id)
        files = subnet.boot or self.config.boot
        default = choose_boot(request, files, server, reservation.boot_file if reservation else "")
        return self.policy.boot(request, default)

    def _destination(
        self, msg: Message, arrival: Arrival, yiaddr: int, *, nak: bool
    ) -> tuple[str, int, bytes | None]:
        """RFC 2131 §4.1, in its order."""
        if int(msg.giaddr):
            return _text(msg.giaddr), self.config.server_port, None
        if arrival.loopback:
            return arrival.source[0], arrival.source[1], None
        if nak:
            return BROADCAST, self.config.client_port, None
        if int(msg.ciaddr):
            return str(msg.ciaddr), self.config.client_port, None
        if msg.broadcast or not yiaddr or msg.htype != 1 or msg.hlen != 6:
            return BROADCAST, self.config.client_port, None
        return str(IPv4Address(yiaddr)), self.config.client_port, msg.chaddr[:6]


_HANDLERS: dict[MessageType, Callable[..., Outcome]] = {
    MessageType.DISCOVER: DhcpServer._discover,
    MessageType.REQUEST: DhcpServer._request,
    MessageType.DECLINE: DhcpServer._decline,
    MessageType.RELEASE: DhcpServer._release,
    MessageType.INFORM: DhcpServer._inform,
}


class _PoolCursor:
    """Hands out a subnet's pool addresses round-robin: O(1) amortized per allocation."""

    def __init__(self, subnet: Subnet) -> None:
        self.addresses = [(low, high) for low, high in subnet.pools]
        self.size = subnet.pool_size
        self.position = 0  # index into the pool, across ranges
        self.fresh = True  # never-leased addresses remain past position

    def _at(self, index: int) -> int:
        for low, high in self.addresses:
            span = high - low + 1
            if index < span:
                return low + index
            index -= span
        raise IndexError(index)

    def next_free(self, never_leased: Callable[[int], bool], usable: Callable[[int], bool]):
        """A never-leased address while there are some, then any usable one."""
        if not self.size:
            return None
        for test in (never_leased, usable) if self.fresh else (usable,):
            for step in range(self.size):
                address = self._at((self.position + step) % self.size)
                if test(address):
                    self.position = (self.position + step + 1) % self.size
                    return address
            self.fresh = False
        return None


def _option_ip(msg: Message, code: int) -> int | None:
    """An address option as an integer (parse_untrusted checked it is 4 bytes long)."""
    value = msg.options.get(code)
    return None if value is None else int.from_bytes(value, "big")


@lru_cache(maxsize=256)
def _text(address: IPv4Address) -> str:
    """Dotted quad of a relay's address: ``str()`` of an IPv4Address costs ~1 µs."""
    return str(address)


def _client_key(msg: Message) -> bytes:
    """Option 61 when sent, else hardware type + address (RFC 2131 §4.2)."""
    client_id = msg.options.get(_CLIENT_ID)
    return client_id if client_id is not None else bytes([msg.htype]) + msg.chaddr[: msg.hlen]


def _hostname(msg: Message, reservation: Reservation | None) -> str:
    if reservation is not None and reservation.hostname:
        return reservation.hostname
    name = msg.hostname
    if not name:
        return ""
    return "".join(c for c in name if c.isalnum() or c in "-_.")[:MAX_HOSTNAME]


def _boot_request(msg: Message, subnet: Subnet) -> BootRequest:
    return BootRequest(
        msg.mac or "",
        tuple(msg.client_arches),
        msg.vendor_class or b"",
        tuple(msg.user_classes),
        subnet.key,
    )


def _link_selection(relay_info: bytes | None) -> IPv4Address | None:
    """RFC 3527 sub-option 5 of option 82, read with every bound checked."""
    if not relay_info:
        return None
    i, end = 0, len(relay_info)
    while i + 2 <= end:
        code, length = relay_info[i], relay_info[i + 1]
        value = relay_info[i + 2 : i + 2 + length]
        if len(value) != length:
            return None
        if code == 5 and length == 4:
            return IPv4Address(value)
        i += 2 + length
    return None


def _lease_options(subnet: Subnet, config: ServerConfig) -> dict[int, bytes]:
    """Lease time, T1 and T2 (options 51, 58, 59) of the subnet, encoded once."""
    lease_time = subnet.lease_time or config.lease_time
    return {
        Opt.LEASE_TIME: encode_u32(lease_time),
        Opt.RENEWAL_TIME: encode_u32(lease_time // 2),
        Opt.REBINDING_TIME: encode_u32(lease_time * 7 // 8),
    }


def _subnet_options(subnet: Subnet, config: ServerConfig) -> dict[int, bytes]:
    """The options every reply on ``subnet`` carries, encoded once."""
    net = subnet.network
    options: dict[int, bytes] = {
        Opt.SUBNET_MASK: encode_ip(net.netmask),
        Opt.BROADCAST_ADDRESS: encode_ip(net.broadcast_address),
    }
    if subnet.router is not None:
        options[Opt.ROUTER] = encode_ip(subnet.router)
    if subnet.dns:
        options[Opt.DNS_SERVERS] = encode_ips(subnet.dns)
    if subnet.domain:
        options[Opt.DOMAIN_NAME] = encode_str(subnet.domain)
    if subnet.mtu is not None:
        options[Opt.INTERFACE_MTU] = encode_u16(subnet.mtu)
    if subnet.ntp:
        options[Opt.NTP_SERVERS] = encode_ips(subnet.ntp)
    if subnet.routes:
        options[Opt.CLASSLESS_STATIC_ROUTES] = encode_routes(subnet.routes)
    return options
