"""The setup dialog's questions, their validation and what they change (pure: no terminal,
no files, no clock; the driver in :mod:`appliance.setup.dialog` asks and answers).

:func:`collect` asks every question through one ``ask`` callable, which returns the
checked value of an :class:`Ask` (the terminal re-asks on :class:`Invalid`, the answers
file turns it into a configuration error naming the key). :func:`apply` writes the
answers into a copy of the existing document; every key the dialog does not ask
about is kept as it was.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from appliance.cluster.jointoken import TokenError, decode_untrusted
from appliance.cluster.schema import DEFAULT_PORT as CLUSTER_PORT
from appliance.nodesection import NAME_PATTERN

NONE_WORDS = ("none", "-")  # what an operator types for "no router", "no virtual IP"


class Invalid(ValueError):
    """An answer refused; ``expected`` says what would be accepted, as config errors do."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


@dataclass(frozen=True)
class Ask:
    key: tuple[str, ...]  # its place in an answers file: ("subnets", "eth1", "network")
    prompt: str
    default: str | None  # shown in brackets, taken on an empty answer; None: required
    check: Callable[[str], Any]  # the checked value, or raises Invalid


@dataclass(frozen=True)
class Interface:
    name: str
    state: str  # operstate: up, down, unknown...
    mac: str


@dataclass(frozen=True)
class Provisioning:
    interface: str
    network: IPv4Network
    pools: tuple[tuple[IPv4Address, IPv4Address], ...]
    router: IPv4Address | None


@dataclass(frozen=True)
class Answers:
    name: str
    rack: str
    management: IPv4Address
    provisioning: tuple[Provisioning, ...]
    vip: IPv4Address | None
    cluster: str  # 'new', 'join' or 'keep'
    token: str | None = None


# -- validators: text in, value out, Invalid with the expectation otherwise -----------


def check_name(text: str, what: str = "name") -> str:
    if not re.fullmatch(NAME_PATTERN, text):
        raise Invalid(f"a {what} of letters, digits, '.', '_' or '-', starting with a letter "
                      "or digit (at most 63)")  # fmt: skip
    return text


def check_address(text: str) -> IPv4Address:
    try:
        address = IPv4Address(text)
    except ValueError:
        raise Invalid("an IPv4 address such as 192.0.2.10") from None
    if (
        address.is_unspecified
        or address.is_multicast
        or address.is_loopback
        or (address == IPv4Address("255.255.255.255"))
    ):
        raise Invalid("a unicast IPv4 address (not 0.0.0.0, loopback, multicast or broadcast)")
    return address


def check_network(text: str) -> IPv4Network:
    if "/" not in text:
        raise Invalid("a subnet in CIDR notation such as 192.0.2.0/24 (address/prefix length)")
    try:
        network = IPv4Network(text, strict=False)
    except ValueError:
        raise Invalid("a subnet in CIDR notation such as 192.0.2.0/24") from None
    if str(network) != text:
        raise Invalid(f"the subnet's network address, {network} ({text} has host bits set)")
    if network.prefixlen > 30:
        raise Invalid("a prefix length of at most /30 (room for machines and a pool)")
    return network


def check_interfaces(text: str, known: Sequence[Interface]) -> tuple[str, ...]:
    names = tuple(n for n in re.split(r"[\s,]+", text) if n)
    available = ", ".join(i.name for i in known) or "none"
    if not names:
        raise Invalid(f"one or more interface names, separated by commas (here: {available})")
    for name in names:
        if name not in {i.name for i in known}:
            raise Invalid(f"interfaces of this machine ({available}); there is no {name!r}")
    if len(set(names)) != len(names):
        raise Invalid("each interface once")
    return names


def _host_in(address: IPv4Address, network: IPv4Network, what: str) -> IPv4Address:
    if address not in network:
        raise Invalid(f"{what} inside {network} ({address} is not)")
    if address in (network.network_address, network.broadcast_address):
        raise Invalid(f"{what} inside {network}, not its network or broadcast address")
    return address


def in_pools(address: IPv4Address, pools: Sequence[tuple[IPv4Address, IPv4Address]]) -> bool:
    return any(low <= address <= high for low, high in pools)


def check_pools(
    text: str, network: IPv4Network, reserved: Sequence[IPv4Address] = ()
) -> tuple[tuple[IPv4Address, IPv4Address], ...]:
    """Ranges 'first-last' (comma-separated), inside the subnet, apart, and clear of the
    addresses already given to this appliance."""
    pools = []
    for part in (p.strip() for p in text.split(",")):
        first, dash, last = part.partition("-")
        try:
            low, high = IPv4Address(first.strip()), IPv4Address(last.strip())
        except ValueError:
            low = high = None
        if not dash or low is None or high is None or low > high:
            raise Invalid("address ranges 'first-last', first <= last, separated by commas, "
                          f"such as {network[10]}-{network[-2]}")  # fmt: skip
        for end in (low, high):
            _host_in(end, network, "a pool")
        pools.append((low, high))
    pools.sort()
    for (_, high), (low, _) in zip(pools, pools[1:], strict=False):
        if low <= high:
            raise Invalid("ranges that do not overlap")
    for address in reserved:
        if in_pools(address, pools):
            raise Invalid(f"ranges that leave out {address} (an address of this appliance)")
    return tuple(pools)


def check_router(text: str, subnet: Provisioning) -> IPv4Address | None:
    if text.lower() in NONE_WORDS:
        return None
    address = _address_or_none_word(text)
    _host_in(address, subnet.network, "a router")
    if in_pools(address, subnet.pools):
        raise Invalid(f"a router outside the pools of {subnet.network} (DHCP would lease it)")
    return address


def check_vip(
    text: str, subnets: Sequence[Provisioning], management: IPv4Address
) -> IPv4Address | None:
    if text.lower() in NONE_WORDS:
        return None
    address = _address_or_none_word(text)
    subnet = subnet_of(address, subnets)
    if subnet is None:
        inside = ", ".join(str(s.network) for s in subnets)
        raise Invalid(f"a virtual IP inside a provisioning subnet ({inside}); {address} is not")
    _host_in(address, subnet.network, "a virtual IP")
    if in_pools(address, subnet.pools):
        raise Invalid(f"a virtual IP outside the pools of {subnet.network} (DHCP would lease it)")
    if address in (subnet.router, management):
        raise Invalid("a virtual IP of its own (not the router or the management address)")
    return address


def check_cluster_choice(text: str, enrolled: bool) -> str:
    """A member stays one: leaving a cluster is done by hand (docs/cluster.md), since
    `cluster init` and `join` refuse a node that has an identity."""
    choices = ("keep",) if enrolled else ("new", "join")
    if text.lower() not in choices:
        if enrolled:
            raise Invalid("'keep': this node already belongs to a cluster")
        raise Invalid("'new' (create a new cluster) or 'join' (paste a join token)")
    return text.lower()


def check_token(text: str, now: float) -> str:
    try:
        decode_untrusted(text, now)
    except TokenError as exc:
        raise Invalid(f"a join token from `rackboot cluster token` ({exc})") from None
    return "".join(text.split())


def _address_or_none_word(text: str) -> IPv4Address:
    try:
        return check_address(text)
    except Invalid as exc:
        raise Invalid(f"{exc.expected}, or 'none'") from None


def subnet_of(address: IPv4Address, subnets: Sequence[Provisioning]) -> Provisioning | None:
    return next((s for s in subnets if address in s.network), None)


# -- the dialog ------------------------------------------------------------------------


@dataclass
class Current:
    """What the existing document says, as the dialog's defaults."""

    name: str | None = None
    rack: str | None = None
    management: str | None = None
    interfaces: tuple[str, ...] = ()
    subnets: dict[str, dict[str, Any]] = field(default_factory=dict)  # by interface
    vip: str | None = None

    @classmethod
    def of(cls, doc: dict[str, Any], hostname: str) -> Current:
        node, dhcp, ha = (_table(doc, name) for name in ("node", "dhcp", "ha"))
        advertise = str(_table(doc, "cluster").get("advertise", ""))
        host = advertise.rpartition(":")[0]
        subnets: dict[str, dict[str, Any]] = {}
        for subnet in dhcp.get("subnets", []):
            if isinstance(subnet, dict) and isinstance(subnet.get("interface"), str):
                subnets.setdefault(subnet["interface"], subnet)
        vip = ha.get("vip")
        return cls(
            name=str(node.get("name", hostname)),
            rack=node.get("rack"),
            management=host if re.fullmatch(r"[0-9.]+", host) else None,
            interfaces=tuple(str(n) for n in dhcp.get("interfaces", [])),
            subnets=subnets,
            # A file written before: no VIP is an answer ("none"); a fresh file asks.
            vip=(str(vip).partition("/")[0] or "none") if "vip" in ha else None,
        )


def collect(
    ask: Callable[[Ask], Any],
    current: Current,
    interfaces: Sequence[Interface],
    *,
    enrolled: bool,
    now: float,
) -> Answers:
    name = ask(Ask(("name",), "Name of this appliance", current.name, check_name))
    rack = ask(Ask(("rack",), "Rack it serves", current.rack,
                   lambda t: check_name(t, "rack name")))  # fmt: skip
    management = ask(Ask(("management_address",), "Management address (other appliances "
                         "reach this one here)", current.management, check_address))  # fmt: skip
    default_interfaces = ", ".join(current.interfaces) or None
    names = ask(Ask(("interfaces",), "Provisioning interface(s), comma-separated",
                    default_interfaces, lambda t: check_interfaces(t, interfaces)))  # fmt: skip
    subnets: list[Provisioning] = []
    for interface in names:
        subnets.append(_ask_subnet(ask, interface, current.subnets.get(interface, {}),
                                   subnets, management))  # fmt: skip
    vip = ask(Ask(("vip",), "The rack's virtual IP (held by the active appliance; 'none')",
                  current.vip, lambda t: check_vip(t, subnets, management)))  # fmt: skip
    if enrolled:
        prompt = "Cluster: this node already belongs to one; 'keep'"
    else:
        prompt = "Cluster: 'new' to create one, 'join' to paste a join token"
    cluster = ask(Ask(("cluster",), prompt, "keep" if enrolled else "new",
                      lambda t: check_cluster_choice(t, enrolled)))  # fmt: skip
    token = None
    if cluster == "join":
        token = ask(Ask(("token",), "Join token (from `rackboot cluster token` on a member)",
                        None, lambda t: check_token(t, now)))  # fmt: skip
    return Answers(name, rack, management, tuple(subnets), vip, cluster, token)


def _ask_subnet(
    ask: Callable[[Ask], Any],
    interface: str,
    old: dict[str, Any],
    earlier: Sequence[Provisioning],
    management: IPv4Address,
) -> Provisioning:
    where = ("subnets", interface)

    def check_apart(text: str) -> IPv4Network:
        network = check_network(text)
        for other in earlier:
            if network.overlaps(other.network):
                raise Invalid(f"a subnet apart from {other.network} (on {other.interface})")
        return network

    network = ask(Ask((*where, "network"), f"Subnet on {interface} (CIDR)",
                      _text(old.get("network")), check_apart))  # fmt: skip
    same = old.get("network") == str(network)  # else the old pools and router are elsewhere
    pools = ask(Ask((*where, "pools"), f"DHCP pool(s) in {network}, 'first-last'",
                    _text(old.get("pools")) if same else None,
                    lambda t: check_pools(t, network, [management])))  # fmt: skip
    partial = Provisioning(interface, network, pools, None)
    router = ask(Ask((*where, "router"), f"Router for machines on {network} ('none')",
                     (_text(old.get("router")) if same else None) or "none",
                     lambda t: check_router(t, partial)))  # fmt: skip
    return Provisioning(interface, network, pools, router)


def _text(value: Any) -> str | None:
    """An existing value as the answer that would give it back."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or None
    return str(value)


def _table(doc: dict[str, Any], name: str) -> dict[str, Any]:
    table = doc.get(name, {})
    return table if isinstance(table, dict) else {}


# -- the answers, written into the document ---------------------------------------------


def apply(doc: dict[str, Any], answers: Answers) -> dict[str, Any]:
    """A copy of ``doc`` with the answers; keys the dialog does not ask about are kept,
    and so are the other keys of each subnet it edits (dns, routes, boot...). Subnets
    of interfaces no longer provisioning are dropped; subnets without an interface stay."""
    out = copy.deepcopy(doc)
    node = out.setdefault("node", {})
    node["name"], node["rack"] = answers.name, answers.rack
    cluster = out.setdefault("cluster", {})
    port = cluster.get("port", CLUSTER_PORT)
    if port:  # port 0 is chosen at start-up and announced by mDNS: nothing to advertise
        cluster["advertise"] = f"{answers.management}:{port}"
    dhcp = out.setdefault("dhcp", {})
    dhcp["interfaces"] = [p.interface for p in answers.provisioning]
    old = [s for s in dhcp.get("subnets", []) if isinstance(s, dict)]
    by_interface = {}
    for subnet in old:
        by_interface.setdefault(subnet.get("interface"), subnet)
    subnets = []
    for p in answers.provisioning:
        subnet = dict(by_interface.get(p.interface, {}))
        subnet.update(network=str(p.network), interface=p.interface,
                      pools=[f"{low}-{high}" for low, high in p.pools])  # fmt: skip
        subnet.pop("router", None)
        if p.router is not None:
            subnet["router"] = str(p.router)
        subnets.append(subnet)
    dhcp["subnets"] = subnets + [s for s in old if "interface" not in s]
    ha = out.setdefault("ha", {})
    home = subnet_of(answers.vip, answers.provisioning) if answers.vip else None
    if home is None:
        ha["vip"], ha["vip_interface"] = "", ""
    else:
        ha["vip"] = f"{answers.vip}/{home.network.prefixlen}"
        ha["vip_interface"] = home.interface
    return out
