"""Router solicitations in, router advertisements out (RFC 4861), sans-IO.

Why at all: iPXE configures IPv6 beside DHCP and prints "Configuring ... ok" only
once its IPv6 configurator is done, which needs one router advertisement; with
none on the link it gives up after ~16 s, on every boot (docs/ra.md). The
advertisement this module builds says nothing but "a router is here": router
lifetime 0 (no host takes us as its default router), no prefix, no M/O flags
(iPXE would start DHCPv6 and wait for it), only our link-layer address.

:class:`Responder` decides, for one interface, from the bytes it hears and an
explicit ``now``: in ``auto`` mode it first solicits and listens for ``listen``
seconds, answers only where no other router advertises, falls quiet as soon as
one does, and probes again once that router has been silent for ``hold``
seconds; in ``always`` mode it answers whatever it hears. "Another router" is an
advertisement that says something ours does not (a router lifetime, a prefix,
M/O flags, any option but a link-layer address or MTU): an empty one like ours,
from the other appliance of the rack say, changes nothing.

Every datagram is parsed by a ``*_untrusted`` function: at most
:data:`MAX_MESSAGE` bytes, the IP hop limit 255 (it came from this link), code 0,
options of non-zero length inside the message, RFC 4861 §6.1's rules.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from ipaddress import IPv6Address

RS, RA = 133, 134
MAX_MESSAGE = 1280  # IPv6's minimum MTU: a longer RS or RA is no real one's, here
HOP_LIMIT = 255  # RFC 4861: sent with 255, and only accepted with 255 (never routed)
RS_HEADER, RA_HEADER = 8, 16
OPT_SOURCE_LL, OPT_MTU = 1, 5
FLAG_MANAGED, FLAG_OTHER = 0x80, 0x40
UNSPECIFIED = bytes(16)
ALL_NODES = bytes.fromhex("ff020000000000000000000000000001")
ALL_ROUTERS = bytes.fromhex("ff020000000000000000000000000002")
# Answers per interface: a burst of BURST, then RATE a second (a flood of solicitations
# must not become a flood of advertisements).
BURST, RATE = 20, 10.0

# Every reason a datagram is dropped for (the counters' keys).
REASONS = (
    "too_long", "too_short", "hop_limit", "code", "bad_option", "not_link_local",
    "unspecified_with_address", "unknown_type",
)  # fmt: skip


class Malformed(ValueError):
    """A datagram that breaks a rule; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Solicitation:
    source_ll: bytes | None  # the soliciting host's link-layer address, if it said


@dataclass(frozen=True)
class Advertisement:
    router_lifetime: int
    flags: int
    option_types: tuple[int, ...]

    @property
    def configures(self) -> bool:
        """Says something ours does not: a real router's (stay quiet beside it)."""
        if self.router_lifetime or self.flags & (FLAG_MANAGED | FLAG_OTHER):
            return True
        return any(kind not in (OPT_SOURCE_LL, OPT_MTU) for kind in self.option_types)


def options_untrusted(data: bytes, start: int) -> list[tuple[int, bytes]]:
    """The (type, body) of each option from ``start`` on: each at least 8 bytes, in units
    of 8, inside the message (a zero length would never end: malformed)."""
    found, at = [], start
    while at < len(data):  # every step moves >= 8 bytes: at most MAX_MESSAGE / 8 steps
        if len(data) - at < 2 or data[at + 1] == 0 or at + data[at + 1] * 8 > len(data):
            raise Malformed("bad_option")
        end = at + data[at + 1] * 8
        found.append((data[at], data[at + 2 : end]))
        at = end
    return found


def _common(data: bytes, hop_limit: int | None, minimum: int) -> None:
    if len(data) > MAX_MESSAGE:
        raise Malformed("too_long")
    if len(data) < minimum:
        raise Malformed("too_short")
    if hop_limit != HOP_LIMIT:  # None: the kernel did not say; not provably from the link
        raise Malformed("hop_limit")
    if data[1] != 0:
        raise Malformed("code")


def parse_solicitation_untrusted(data: bytes, source: bytes, hop_limit: int | None) -> Solicitation:
    """An RS (RFC 4861 §6.1.1) from IPv6 address ``source``; raises :class:`Malformed`."""
    _common(data, hop_limit, RS_HEADER)
    options = options_untrusted(data, RS_HEADER)
    source_ll = next((body for kind, body in options if kind == OPT_SOURCE_LL), None)
    if source == UNSPECIFIED and source_ll is not None:
        raise Malformed("unspecified_with_address")
    return Solicitation(source_ll[:6] if source_ll is not None else None)


def parse_advertisement_untrusted(data: bytes, source: bytes,
                                  hop_limit: int | None) -> Advertisement:  # fmt: skip
    """An RA (RFC 4861 §6.1.2) from IPv6 address ``source``; raises :class:`Malformed`."""
    _common(data, hop_limit, RA_HEADER)
    if not is_link_local(source):
        raise Malformed("not_link_local")
    options = options_untrusted(data, RA_HEADER)
    lifetime = int.from_bytes(data[6:8], "big")
    return Advertisement(lifetime, data[5], tuple(kind for kind, _ in options))


def is_link_local(address: bytes) -> bool:
    return len(address) == 16 and address[0] == 0xFE and address[1] & 0xC0 == 0x80


def _link_layer_option(mac: bytes | None) -> bytes:
    # type, length in units of 8 bytes, the 6-byte Ethernet address (RFC 4861 §4.6.1)
    return bytes((OPT_SOURCE_LL, 1)) + mac if mac is not None and len(mac) == 6 else b""


def build_advertisement(mac: bytes | None) -> bytes:
    """An RA that makes no one route through us: current hop limit, flags, router
    lifetime, reachable time and retransmission timer all 0 ("unspecified"), and our
    link-layer address. The checksum is left 0: the kernel fills it for ICMPv6."""
    return bytes((RA, 0)) + bytes(14) + _link_layer_option(mac)


def build_solicitation(mac: bytes | None) -> bytes:
    """An RS, to hear the routers of a link at once rather than at their next interval."""
    return bytes((RS, 0)) + bytes(6) + _link_layer_option(mac)


@dataclass(frozen=True)
class Policy:
    mode: str  # "auto" | "always"
    listen: float = 2.0  # auto: seconds after our solicitation before answering
    hold: float = 3600.0  # auto: seconds quiet after another router's last advertisement


@dataclass(frozen=True)
class Send:
    payload: bytes
    destination: bytes  # 16 bytes: ff02::1, ff02::2 or a host's link-local address


@dataclass
class Responder:
    """One interface's decisions. Call :meth:`start` once, then :meth:`receive` for each
    datagram and :meth:`tick` at :meth:`deadline`; send what they return."""

    policy: Policy
    mac: bytes | None
    state: str = "answering"  # probing | answering | quiet
    until: float | None = None  # probing: when it ends; quiet: when to probe again
    router: bytes | None = None  # the last other router heard
    router_seen: float | None = None
    tokens: float = BURST
    refilled: float = 0.0
    counts: Counter = field(default_factory=Counter)  # solicitations, answered, ...
    dropped: Counter = field(default_factory=Counter)  # by reason, REASONS

    def start(self, now: float) -> list[Send]:
        self.refilled = now
        return self._probe(now) if self.policy.mode == "auto" else []

    def deadline(self) -> float | None:
        return self.until

    def tick(self, now: float) -> list[Send]:
        if self.until is None or now < self.until:
            return []
        if self.state == "probing":
            self.state, self.until = "answering", None
            return []
        return self._probe(now)  # quiet, and the other router has been silent for hold

    def receive(self, data: bytes, source: bytes, hop_limit: int | None, now: float) -> list[Send]:
        out = self.tick(now)
        kind = data[0] if data else -1
        try:
            if kind == RA:
                advertisement = parse_advertisement_untrusted(data, source, hop_limit)
                self._heard(advertisement, source, now)
                return out
            if kind != RS:  # the socket's filter passes RS and RA only: count what slipped by
                raise Malformed("unknown_type")
            # Valid is all that matters: the answer is the same for every host.
            parse_solicitation_untrusted(data, source, hop_limit)
        except Malformed as exc:
            self.dropped[exc.reason] += 1
            return out
        self.counts["solicitations"] += 1
        if self.state != "answering":
            self.counts["not_answered"] += 1
            return out
        if not self._take_token(now):
            self.counts["rate_limited"] += 1
            return out
        self.counts["answered"] += 1
        # RFC 4861 §6.2.6: a solicitation from an address may be answered to it alone (its
        # link-local one: reachable on this link without a route), else to all nodes
        destination = source if is_link_local(source) else ALL_NODES
        return [*out, Send(build_advertisement(self.mac), destination)]

    def _heard(self, advertisement: Advertisement, source: bytes, now: float) -> None:
        if not advertisement.configures:
            self.counts["empty_advertisements"] += 1  # ours, the rack peer's: no router
            return
        self.counts["router_advertisements"] += 1
        self.router, self.router_seen = source, now
        if self.policy.mode == "auto":
            self.state, self.until = "quiet", now + self.policy.hold

    def _probe(self, now: float) -> list[Send]:
        self.state, self.until = "probing", now + self.policy.listen
        self.counts["probes"] += 1
        return [Send(build_solicitation(self.mac), ALL_ROUTERS)]

    def _take_token(self, now: float) -> bool:
        self.tokens = min(BURST, self.tokens + max(0.0, now - self.refilled) * RATE)
        self.refilled = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def status(self, now: float) -> dict:
        return {
            "state": self.state,
            "mode": self.policy.mode,
            "until": None if self.until is None else round(self.until - now, 1),
            "router": _text(self.router) if self.router is not None else None,
            "router_seen_ago": None
            if self.router_seen is None
            else round(now - self.router_seen, 1),
            **{key: self.counts[key] for key in COUNTS},
            "dropped": dict(self.dropped),
        }


COUNTS = ("solicitations", "answered", "not_answered", "rate_limited", "probes",
          "router_advertisements", "empty_advertisements")  # fmt: skip


def _text(address: bytes) -> str:
    return str(IPv6Address(address))
