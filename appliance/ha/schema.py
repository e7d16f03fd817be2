"""The ``[ha]`` configuration section and the rules its timings must obey (sans-IO).

The lease timings decide both safety and the failover gap, so they are
checked together, each error naming the key and the bound it broke:

* the holder's margin must exceed what clock-rate error can eat of a lease
  (``2 * max_clock_rate_error * lease``: the holder's clock may run slow while
  an acceptor's runs fast), plus a floor for scheduling jitter;
* a renewal must fit at least twice in the part of the lease the holder may
  use (``lease - margin``), so one lost round is retried before expiry;
* the margin is less than half the lease (else the holder is valid for less
  time than it spends renewing).
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.errors import ConfigError
from appliance.schema import (
    Bool,
    Choice,
    Field,
    Float,
    Int,
    IPv4Address,
    List,
    Listener,
    Section,
    Str,
)  # fmt: skip

DEFAULT_PORT = 7471
ADDRESS_PATTERN = r"[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}"
MEMBER_PATTERN = r"[0-9a-f]{16}@" + ADDRESS_PATTERN
MEMBER_EXPECTED = "'NODE-ID@host:port' (the node id `rackboot status` lists for that member)"
VIP_PATTERN = r"([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}"
MIN_MARGIN = 0.005  # scheduling jitter of the holder's own process, at the least
SPLIT_BRAIN_OPT_IN = "accept_split_brain_risk"

SECTION = Section(
    "ha",
    doc=(
        "Active/standby within the rack: a majority lease among the rack's appliances and\n"
        "at least one witness (`rackboot witness`). Without peers or witnesses the node is\n"
        "standalone and always active (see docs/ha.md)."
    ),
    fields={
        "backend": Field(
            Choice("embedded", "etcd"),
            default="embedded",
            doc="'embedded': PaxosLease among peers and witnesses; 'etcd': a lease in etcd.",
        ),
        "listen": Field(
            IPv4Address(),
            default="0.0.0.0",
            dev_default="127.0.0.1",
            doc="Address the election's UDP socket binds (signed datagrams).",
        ),
        "port": Field(Int(min=0, max=65535), default=DEFAULT_PORT, doc="UDP port of the election; replication uses TCP on the next port up."),
        "peers": Field(
            List(Str(MEMBER_PATTERN, MEMBER_EXPECTED, max_len=280), max_items=16),
            default=(),
            doc="The rack's other appliances: 'NODE-ID@host:port' of their election port.",
        ),
        "witnesses": Field(
            List(Str(MEMBER_PATTERN, MEMBER_EXPECTED, max_len=280), max_items=16),
            default=(),
            doc="Witnesses (`rackboot witness`) voting in this rack's election, "
            "'NODE-ID@host:port'.",
        ),
        SPLIT_BRAIN_OPT_IN: Field(
            Bool(),
            default=False,
            doc="Allow two appliances without a witness: each may then hold the lease alone "
            "when it cannot reach the other, so a partition makes both active.",
        ),
        "lease": Field(
            Float(min=0.1, max=60.0), default=1.0, doc="Lease length in seconds (acceptors' timer)."
        ),
        "renew": Field(
            Float(min=0.01, max=30.0), default=0.25, doc="Seconds between renewals by the holder."
        ),
        "margin": Field(
            Float(min=0.0, max=30.0),
            default=0.15,
            doc="The holder stops this many seconds before the acceptors' timers end.",
        ),
        "max_clock_rate_error": Field(
            Float(min=0.0, max=0.1),
            default=0.001,
            doc="Worst relative clock-rate error between two nodes (0.001 = 1000 ppm).",
        ),
        "maintenance": Field(
            Bool(), default=False, doc="Start in maintenance: vote, but never take the lease."
        ),
        "max_clock_skew": Field(
            Float(min=0.1, max=3600.0),
            default=10.0,
            doc="Seconds a standby's wall clock may differ from the active's before it is "
            "declared ineligible to take over (DHCP leases expire by wall-clock time).",
        ),
        "vip": Field(
            Str(f"({VIP_PATTERN})?", "'' or an IPv4 address with prefix, '192.0.2.1/24'"),
            default="",
            doc="The rack's virtual IP, held by the active appliance ('' = none).",
        ),
        "vip_interface": Field(
            Str(r"([^/\s]{1,15})?", "'' or an interface name"),
            default="",
            doc="Interface the virtual IP goes on.",
        ),
        "garp_count": Field(
            Int(min=0, max=20),
            default=4,
            doc="Gratuitous ARPs sent after taking the VIP (spaced out, so neighbours that "
            "missed the first ones still learn the new holder).",
        ),
        "garp_interval": Field(
            Float(min=0.01, max=10.0),
            default=0.25,
            doc="Seconds between gratuitous ARPs (doubling after each).",
        ),
        "etcd_endpoints": Field(
            List(Str(r"https?://\S{1,250}", "an http(s)://host:port URL", max_len=260)),
            default=("http://127.0.0.1:2379",),
            doc="etcd v3 JSON gateway endpoints (backend = 'etcd').",
        ),
        "etcd_prefix": Field(
            Str(r"/\S{0,200}", "a key prefix starting with '/'"),
            default="/rackboot/leader/",
            doc="The leader key is this prefix followed by the rack name.",
        ),
    },
    listeners=(
        # The embedded election binds only with someone to elect with; replication
        # (TCP, the next port up) only with peers to replicate to.
        Listener("udp", port="port", addresses="listen",
                 when=lambda s: s.backend == "embedded" and bool(s.peers or s.witnesses)),
        Listener("tcp", port="port", addresses="listen", offset=1,
                 when=lambda s: s.backend == "embedded" and bool(s.peers)),
    ),  # fmt: skip
)


@dataclass(frozen=True)
class Timing:
    """Lease timings, validated by :func:`check_timing`."""

    lease: float = 1.0
    renew: float = 0.25
    margin: float = 0.15
    max_clock_rate_error: float = 0.001

    @property
    def usable(self) -> float:
        """How long a grant lets the holder act, from the moment it started asking."""
        return self.lease - self.margin

    @property
    def round_timeout(self) -> float:
        """A round (prepare + propose) that has not finished by then has failed."""
        return self.renew

    @property
    def step_down_lead(self) -> float:
        """Without a renewal, the holder steps down this long before its validity ends."""
        return min(0.05, self.margin / 2)


def check_timing(timing: Timing, source: str = "<settings>", section: str = "ha") -> Timing:
    """Raise :class:`ConfigError` naming the key whose value breaks a rule."""
    drift = 2 * timing.max_clock_rate_error * timing.lease
    need = drift + MIN_MARGIN
    if timing.margin < need:
        raise ConfigError(
            source,
            f"{section}.margin",
            f"a margin >= {need:.4g} s (2 x max_clock_rate_error {timing.max_clock_rate_error:g}"
            f" x lease {timing.lease:g} s, plus {MIN_MARGIN:g} s of scheduling jitter)",
            timing.margin,
        )
    if timing.margin >= timing.lease / 2:
        raise ConfigError(
            source,
            f"{section}.margin",
            f"a margin < half the lease ({timing.lease / 2:g} s)",
            timing.margin,
        )
    if 2 * timing.renew > timing.usable:
        raise ConfigError(
            source,
            f"{section}.renew",
            f"a renewal interval <= (lease - margin) / 2 = {timing.usable / 2:g} s, so a lost "
            "round is retried before the lease ends",
            timing.renew,
        )
    return timing


def timing_from(settings, source: str) -> Timing:
    return check_timing(
        Timing(settings.lease, settings.renew, settings.margin, settings.max_clock_rate_error),
        source,
    )


def check_settings(settings, source: str) -> None:
    """Cross-key rules of ``[ha]``: timings, the witness rule, the VIP."""
    timing_from(settings, source)
    if settings.backend == "embedded":
        appliances = 1 + len(settings.peers)
        if appliances == 2 and not settings.witnesses and not settings[SPLIT_BRAIN_OPT_IN]:
            raise ConfigError(
                source,
                "ha.witnesses",
                "at least one witness for a two-appliance rack (`rackboot witness` on another "
                f"host), or ha.{SPLIT_BRAIN_OPT_IN} = true to accept that a partition makes "
                "both appliances active",
                [],
            )
        ids = [parse_member(m)[0] for m in (*settings.peers, *settings.witnesses)]
        if len(set(ids)) != len(ids):
            raise ConfigError(
                source, "ha.peers", "each acceptor listed once across peers and witnesses",
                [*settings.peers, *settings.witnesses],
            )  # fmt: skip
    if bool(settings.vip) != bool(settings.vip_interface):
        key = "ha.vip_interface" if settings.vip else "ha.vip"
        raise ConfigError(
            source, key, "both ha.vip and ha.vip_interface, or neither", settings[key[3:]]
        )


def parse_member(text: str) -> tuple[str, str]:
    """``NODE-ID@host:port`` -> (node id, 'host:port'); the schema checked the form."""
    node_id, _, address = text.partition("@")
    return node_id, address


def quorum(acceptors: int, split_brain_opt_in: bool = False) -> int:
    """Grants a lease needs: a majority; one of two under the explicit opt-in."""
    if acceptors == 2 and split_brain_opt_in:
        return 1
    return acceptors // 2 + 1


def epoch_quorum(acceptors: int, split_brain_opt_in: bool = False) -> int:
    """How many answering acceptors must remember epochs before a new epoch is picked.

    An earlier grant's majority escapes them only if it fits among the others,
    which it cannot once they number more than ``acceptors - quorum``. The
    opted-in pair has two disjoint "majorities" of one: its epochs can collide
    under partition, which is part of the risk accepted.
    """
    if acceptors == 2 and split_brain_opt_in:
        return 1
    return acceptors - quorum(acceptors) + 1
