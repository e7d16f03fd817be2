"""The DHCP relay agent (RFC 1542, RFC 3046, RFC 3527, RFC 5107), sans-IO.

:meth:`RelayAgent.from_client` takes a datagram that arrived on a client-facing
interface and returns what to forward to the servers (a :class:`Forward`);
:meth:`RelayAgent.from_server` takes a datagram from the upstream side and returns
where to deliver it (a :class:`Deliver`). Both return None for a datagram they drop
and count it by the rule it broke; the agent counts everything it does (its counters
are the plugin's status and metrics). It keeps no state between datagrams: a relay is a function of its
configuration, so any appliance may run it and a failover loses nothing.

Requests (``op`` 1): at most :data:`MAX_MESSAGE` bytes; ``hops`` below
``max_hops`` (then increased); with ``giaddr`` 0 the agent sets ``giaddr`` (the
interface's address, or ``source`` with link selection) and appends option 82
(circuit-id, remote-id, link selection, server-identifier override, as the
interface's configuration says) unless the packet would grow past
:data:`MAX_FORWARD` (then it goes without, counted, RFC 3046 §2.1); a request
that already carries option 82 with ``giaddr`` 0 came from an untrusted
circuit and is dropped unless ``trust_option82``; a ``giaddr`` that is one of
ours is a loop. A request relayed by another agent (``giaddr`` set) keeps its
``giaddr`` and options.

Replies (``op`` 2): only from a configured server; ``giaddr`` must be ours; the
interface is the one whose circuit-id the echoed option 82 carries (it must
agree with ``giaddr``), else the one ``giaddr`` names; option 82 is stripped.
Delivery follows RFC 2131 §4.1 and RFC 1542 §5.4: broadcast when the
broadcast flag is set or for a NAK, else to ``ciaddr`` if set, else to
``yiaddr`` at ``chaddr`` (the shell sets an ARP entry), else broadcast.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

MAGIC_COOKIE = b"\x63\x82\x53\x63"
OPTIONS_AT = 240
MAX_MESSAGE = 4096  # a DHCP message longer than this is no client's: malformed
MAX_FORWARD = 1472  # a 1500-byte IP datagram: option 82 is not added past it
BROADCAST_FLAG = 0x8000
BROADCAST_FLAG_BYTE = BROADCAST_FLAG >> 8  # in the first byte of the flags field
BROADCAST = 0xFFFFFFFF
NO_ADDRESS = bytes(4)
END = b"\xff"
BYTE = [bytes((i,)) for i in range(256)]  # a byte by value, without making one
OPT_PAD, OPT_MESSAGE_TYPE, OPT_RELAY_INFO, OPT_END = 0, 53, 82, 255
NAK = 6
SUB_CIRCUIT_ID, SUB_REMOTE_ID, SUB_LINK_SELECTION, SUB_SERVER_ID_OVERRIDE = 1, 2, 5, 11

# Every reason a datagram may be dropped for (the counters' keys).
REASONS = (
    "malformed", "hops", "loop", "untrusted_option82", "reply_on_client_side",
    "request_on_server_side", "not_a_server", "unknown_giaddr", "circuit_mismatch", "no_route",
)  # fmt: skip


@dataclass(frozen=True)
class Link:
    """A client-facing interface and what the agent says about it."""

    name: str
    address: int  # its IPv4 address: giaddr, and the link in option 82
    circuit_id: bytes
    remote_id: bytes = b""
    link_selection: bool = False  # RFC 3527: giaddr is the relay's source address
    server_id_override: bool = False  # RFC 5107

    def option82(self) -> bytes:
        """Option 82 as this interface's requests carry it (code and length included)."""
        subs = [(SUB_CIRCUIT_ID, self.circuit_id)]
        if self.remote_id:
            subs.append((SUB_REMOTE_ID, self.remote_id))
        if self.link_selection:
            subs.append((SUB_LINK_SELECTION, self.address.to_bytes(4, "big")))
        if self.server_id_override:
            subs.append((SUB_SERVER_ID_OVERRIDE, self.address.to_bytes(4, "big")))
        value = b"".join(bytes((code, len(v))) + v for code, v in subs)
        if len(value) > 255:
            raise ValueError(f"{self.name}: option 82 would be {len(value)} bytes (at most 255)")
        return bytes((OPT_RELAY_INFO, len(value))) + value


@dataclass(frozen=True)
class RelayConfig:
    links: tuple[Link, ...]
    servers: tuple[int, ...]
    source: int = 0  # the relay's upstream address (giaddr under link selection); 0: none
    max_hops: int = 4
    trust_option82: bool = False


# Results are NamedTuples, made once per datagram: a frozen dataclass's __init__ costs
# twice as much (object.__setattr__ per field), and the relay's CPU per datagram is
# what its throughput at saturation is made of (bench.relay).
class Forward(NamedTuple):
    payload: bytes
    servers: tuple[int, ...]  # the same payload goes to each


class Deliver(NamedTuple):
    payload: bytes
    interface: str
    address: int  # BROADCAST, or the client's address
    hwaddr: bytes | None = None  # unicast to a client without an address: its ARP entry


class Malformed(ValueError):
    pass


class RelayAgent:
    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.links = {link.name: link for link in config.links}
        self._by_circuit = {link.circuit_id: link for link in config.links}
        self._by_address: dict[int, list[Link]] = {}
        for link in config.links:
            self._by_address.setdefault(link.address, []).append(link)
        self._ours = frozenset(self._by_address) | ({config.source} if config.source else set())
        # Per datagram the agent compares and copies bytes: what it writes is made here.
        self._ours_packed = frozenset(a.to_bytes(4, "big") for a in self._ours)
        self._giaddr_and_tail = {  # giaddr to set, and what follows the client's options
            link.name: (
                (config.source if link.link_selection else link.address).to_bytes(4, "big"),
                link.option82() + b"\xff",
            )
            for link in config.links
        }
        self._servers = frozenset(config.servers)
        self.requests: Counter[str] = Counter()  # forwarded, by interface
        self.replies: Counter[str] = Counter()  # delivered, by interface
        self.dropped: Counter[str] = Counter()  # by reason
        self.option82_skipped = 0  # forwarded without option 82: no room (RFC 3046 §2.1)

    # -- client side --------------------------------------------------------------------

    def from_client(self, data: bytes, interface: str) -> Forward | None:
        """A datagram that arrived on client-facing ``interface``."""
        giaddr, tail = self._giaddr_and_tail[interface]
        try:
            end, span82, _ = scan_untrusted(data)
        except Malformed:
            return self._drop("malformed")
        if data[0] != 1:
            return self._drop("reply_on_client_side")
        hops = data[3]
        if hops >= self.config.max_hops:
            return self._drop("hops")
        if data[24:28] != NO_ADDRESS:  # relayed by another agent: its giaddr and options stay
            if data[24:28] in self._ours_packed:
                return self._drop("loop")
            payload = b"".join((data[:3], BYTE[hops + 1], data[4:]))
        else:
            if span82 is not None:
                if not self.config.trust_option82:
                    return self._drop("untrusted_option82")
                tail = END
            elif end + len(tail) > MAX_FORWARD:
                tail = END
                self.option82_skipped += 1
            # One copy: the header with hops and giaddr replaced, options, option 82, END
            payload = b"".join((data[:3], BYTE[hops + 1], data[4:24], giaddr, data[28:end], tail))
        self.requests[interface] += 1
        return Forward(payload, self.config.servers)

    # -- server side --------------------------------------------------------------------

    def owns(self, address: int) -> bool:
        """Is ``address`` a giaddr of this relay?"""
        return address in self._ours

    def from_server(self, data: bytes, source: int, *, local: bool = False) -> Deliver | None:
        """A datagram from ``source`` on the upstream side; ``local``: a reply of the DHCP
        server of this process, handed over (it is a server whatever its address)."""
        if data[:1] == b"\x01":  # a client's broadcast on the upstream link, not hostile
            return self._drop("request_on_server_side")
        if not local and source not in self._servers:
            return self._drop("not_a_server")
        try:
            end, span82, kind = scan_untrusted(data)
        except Malformed:
            return self._drop("malformed")
        if data[0] != 2:
            return self._drop("request_on_server_side")
        if data[24:28] not in self._ours_packed:
            return self._drop("unknown_giaddr")
        named = self._by_address.get(int.from_bytes(data[24:28], "big"), ())
        if span82 is not None:
            link = self._by_circuit.get(circuit_id(data[span82[0] + 2 : span82[1]]) or b"")
            if link is None or (named and link not in named):
                return self._drop("circuit_mismatch")
            data = data[: span82[0]] + data[span82[1] :]  # the client never sees it
        elif len(named) == 1:
            link = named[0]
        else:  # giaddr is the shared source address and the server dropped option 82
            return self._drop("no_route")
        self.replies[link.name] += 1
        if data[10] & BROADCAST_FLAG_BYTE or kind == NAK:
            return Deliver(data, link.name, BROADCAST)
        if data[12:16] != NO_ADDRESS:  # ciaddr
            return Deliver(data, link.name, int.from_bytes(data[12:16], "big"))
        if data[16:20] != NO_ADDRESS and data[1] == 1 and data[2] == 6:
            # yiaddr, on Ethernet: an ARP entry can be set
            return Deliver(data, link.name, int.from_bytes(data[16:20], "big"), data[28:34])
        return Deliver(data, link.name, BROADCAST)

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1


def scan_untrusted(data: bytes) -> tuple[int, tuple[int, int] | None, int]:
    """Check a BOOTP/DHCP message's frame and walk its options field: (where END is,
    or the length when it has none; the span of option 82 if present; the message
    type, 0 if absent). Raises :class:`Malformed`. Options continued in ``sname``
    or ``file`` (overload) are not read: option 82 lives in the options field."""
    n = len(data)
    if n < OPTIONS_AT or n > MAX_MESSAGE:
        raise Malformed("length")
    if data[0] not in (1, 2) or data[2] > 16 or data[236:240] != MAGIC_COOKIE:
        raise Malformed("header")
    i, span82, kind = OPTIONS_AT, None, 0
    while i < n:
        code = data[i]
        if code == OPT_PAD:
            i += 1
            continue
        if code == OPT_END:
            return i, span82, kind
        if i + 1 >= n:
            raise Malformed("truncated option")
        end = i + 2 + data[i + 1]
        if end > n:
            raise Malformed("truncated option")
        if code == OPT_RELAY_INFO:
            if span82 is not None:
                raise Malformed("option 82 twice")
            span82 = (i, end)
        elif code == OPT_MESSAGE_TYPE and end - i == 3:
            kind = data[i + 2]
        i = end
    return n, span82, kind


def circuit_id(value: bytes) -> bytes | None:
    """Sub-option 1 of an option 82 value, every bound checked; None if absent."""
    i, n = 0, len(value)
    while i + 2 <= n:
        code, length = value[i], value[i + 1]
        if i + 2 + length > n:
            return None
        if code == SUB_CIRCUIT_ID:
            return value[i + 2 : i + 2 + length]
        i += 2 + length
    return None
