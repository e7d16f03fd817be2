"""The setup dialog's answers, checked: text in, value out, :class:`Invalid` naming what
would be accepted otherwise (pure; :mod:`.questions` asks them in order)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface, IPv4Network

from appliance.cluster.jointoken import TokenError, decode_untrusted
from appliance.nodesection import NAME_PATTERN

NONE_WORDS = ("none", "-")  # what an operator types for "no router", "no virtual IP"


class Invalid(ValueError):
    """An answer refused; ``expected`` says what would be accepted, as config errors do."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


@dataclass(frozen=True)
class Interface:
    name: str
    state: str  # operstate: up, down, unknown...
    mac: str


@dataclass(frozen=True)
class Management:
    interface: str
    address: IPv4Interface  # with its network's prefix length
    gateway: IPv4Address | None


@dataclass(frozen=True)
class Provisioning:
    interface: str
    network: IPv4Network
    address: IPv4Address  # this appliance's, on that interface
    pools: tuple[tuple[IPv4Address, IPv4Address], ...]
    router: IPv4Address | None


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


def check_interface(text: str, known: Sequence[Interface]) -> str:
    names = check_interfaces(text, known)
    if len(names) != 1:
        raise Invalid("one interface")
    return names[0]


def check_management_address(text: str) -> IPv4Interface:
    address, slash, prefix = text.partition("/")
    if not slash or not prefix.isdigit() or not 1 <= int(prefix) <= 30:
        raise Invalid("an address with its prefix length (1-30) such as 10.0.0.5/24")
    interface = IPv4Interface(f"{check_address(address)}/{prefix}")
    return IPv4Interface(f"{_host_in(interface.ip, interface.network, 'an address')}/{prefix}")


def check_gateway(text: str, management: IPv4Interface) -> IPv4Address | None:
    if text.lower() in NONE_WORDS:
        return None
    address = _host_in(_address_or_none_word(text), management.network, "a gateway")
    if address == management.ip:
        raise Invalid("a gateway other than this appliance's own address")
    return address


def check_own_address(text: str, network: IPv4Network) -> IPv4Address:
    return _host_in(check_address(text), network, "an address")


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
    if address == subnet.address:
        raise Invalid(f"a router other than this appliance ({address}: it routes nothing)")
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
    if address in (subnet.router, management, *(s.address for s in subnets)):
        raise Invalid("a virtual IP of its own (not the router or an address of this appliance)")
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
