"""The setup dialog's questions in order, and what the answers change in the document
(pure: no terminal, no files, no clock; the driver in :mod:`appliance.setup.dialog` asks
and answers, :mod:`.checks` checks each answer).

:func:`collect` asks every question through one ``ask`` callable, which returns the
checked value of an :class:`Ask` (the terminal re-asks on :class:`Invalid`, the answers
file turns it into a configuration error naming the key). :func:`apply` writes the
answers into a copy of the existing document; every key the dialog does not ask
about is kept as it was.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from appliance.cluster.schema import DEFAULT_PORT as CLUSTER_PORT
from appliance.setup.checks import (
    Interface,
    Invalid,
    Management,
    Provisioning,
    check_cluster_choice,
    check_gateway,
    check_interface,
    check_interfaces,
    check_management_address,
    check_name,
    check_network,
    check_own_address,
    check_pools,
    check_router,
    check_token,
    check_vip,
    subnet_of,
)

__all__ = ["Answers", "Ask", "Current", "Interface", "Invalid", "apply", "collect"]


@dataclass(frozen=True)
class Ask:
    key: tuple[str, ...]  # its place in an answers file: ("subnets", "eth1", "network")
    prompt: str
    default: str | None  # shown in brackets, taken on an empty answer; None: required
    check: Callable[[str], Any]  # the checked value, or raises Invalid


@dataclass(frozen=True)
class Answers:
    name: str
    rack: str
    management: Management
    provisioning: tuple[Provisioning, ...]
    vip: IPv4Address | None
    cluster: str  # 'new', 'join' or 'keep'
    token: str | None = None


# -- the dialog ------------------------------------------------------------------------


@dataclass
class Current:
    """What the existing document says, as the dialog's defaults."""

    name: str | None = None
    rack: str | None = None
    management_interface: str | None = None
    management: str | None = None  # address/prefix
    gateway: str = "none"
    interfaces: tuple[str, ...] = ()
    subnets: dict[str, dict[str, Any]] = field(default_factory=dict)  # by interface
    addresses: dict[str, str] = field(default_factory=dict)  # ours, by interface
    vip: str | None = None

    @classmethod
    def of(cls, doc: dict[str, Any], hostname: str) -> Current:
        node, dhcp, ha, network = (_table(doc, n) for n in ("node", "dhcp", "ha", "network"))
        subnets: dict[str, dict[str, Any]] = {}
        for subnet in dhcp.get("subnets", []):
            if isinstance(subnet, dict) and isinstance(subnet.get("interface"), str):
                subnets.setdefault(subnet["interface"], subnet)
        addresses = {
            str(entry.get("interface")): str(entry.get("address", "")).partition("/")[0]
            for entry in network.get("provisioning", [])
            if isinstance(entry, dict)
        }
        vip = ha.get("vip")
        return cls(
            name=str(node.get("name", hostname)),
            rack=node.get("rack"),
            management_interface=_text(network.get("management_interface")),
            management=_text(network.get("management_address")),
            gateway=_text(network.get("management_gateway")) or "none",
            interfaces=tuple(str(n) for n in dhcp.get("interfaces", [])),
            subnets=subnets,
            addresses=addresses,
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
    management = _ask_management(ask, current, interfaces)
    default_interfaces = ", ".join(current.interfaces) or None
    names = ask(Ask(("interfaces",), "Provisioning interface(s), comma-separated",
                    default_interfaces, lambda t: check_interfaces(t, interfaces)))  # fmt: skip
    subnets: list[Provisioning] = []
    for interface in names:
        subnets.append(_ask_subnet(ask, interface, current, subnets, management))
    vip = ask(Ask(("vip",), "The rack's virtual IP (held by the active appliance; 'none')",
                  current.vip, lambda t: check_vip(t, subnets, management.address.ip)))  # fmt: skip
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


def _ask_management(
    ask: Callable[[Ask], Any], current: Current, interfaces: Sequence[Interface]
) -> Management:
    interface = ask(Ask(("management_interface",), "Management interface",
                        current.management_interface,
                        lambda t: check_interface(t, interfaces)))  # fmt: skip
    address = ask(Ask(("management_address",), "Management address/prefix (other appliances "
                      "reach this one here)", current.management, check_management_address))  # fmt: skip
    gateway = ask(Ask(("management_gateway",), "Management gateway ('none')", current.gateway,
                      lambda t: check_gateway(t, address)))  # fmt: skip
    return Management(interface, address, gateway)


def _ask_subnet(
    ask: Callable[[Ask], Any],
    interface: str,
    current: Current,
    earlier: Sequence[Provisioning],
    management: Management,
) -> Provisioning:
    where = ("subnets", interface)
    old = current.subnets.get(interface, {})

    def check_apart(text: str) -> IPv4Network:
        network = check_network(text)
        for other in earlier:
            if network.overlaps(other.network):
                raise Invalid(f"a subnet apart from {other.network} (on {other.interface})")
        if interface != management.interface and network.overlaps(management.address.network):
            raise Invalid(f"a subnet apart from the management network "
                          f"{management.address.network} (on {management.interface})")  # fmt: skip
        return network

    network = ask(Ask((*where, "network"), f"Subnet on {interface} (CIDR)",
                      _text(old.get("network")), check_apart))  # fmt: skip
    same = old.get("network") == str(network)  # else the old pools and router are elsewhere
    address = ask(Ask((*where, "address"), f"This appliance's address on {interface}",
                      _own_address(current, interface, network, management),
                      lambda t: check_own_address(t, network)))  # fmt: skip
    reserved = [management.address.ip, address]
    pools = ask(Ask((*where, "pools"), f"DHCP pool(s) in {network}, 'first-last'",
                    _text(old.get("pools")) if same else None,
                    lambda t: check_pools(t, network, reserved)))  # fmt: skip
    partial = Provisioning(interface, network, address, pools, None)
    router = ask(Ask((*where, "router"), f"Router for machines on {network} ('none')",
                     (_text(old.get("router")) if same else None) or "none",
                     lambda t: check_router(t, partial)))  # fmt: skip
    return Provisioning(interface, network, address, pools, router)


def _own_address(
    current: Current, interface: str, network: IPv4Network, management: Management
) -> str | None:
    """The address this interface had, if it is still in its subnet; on the management
    interface, the management address when it is in the subnet."""
    candidates = [current.addresses.get(interface)]
    if interface == management.interface:
        candidates.append(str(management.address.ip))
    for text in candidates:
        try:
            if text and IPv4Address(text) in network:
                return text
        except ValueError:
            continue
    return None


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
        cluster["advertise"] = f"{answers.management.address.ip}:{port}"
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
    out["network"] = _network(out.get("network"), answers)
    ha = out.setdefault("ha", {})
    home = subnet_of(answers.vip, answers.provisioning) if answers.vip else None
    if home is None:
        ha["vip"], ha["vip_interface"] = "", ""
    else:
        ha["vip"] = f"{answers.vip}/{home.network.prefixlen}"
        ha["vip_interface"] = home.interface
    return out


def _network(old: Any, answers: Answers) -> dict[str, Any]:
    """[network] (appliance/setup/networkd.py): every key is the dialog's."""
    management = answers.management
    network = dict(old) if isinstance(old, dict) else {}
    network["management_interface"] = management.interface
    network["management_address"] = str(management.address)
    network.pop("management_gateway", None)
    if management.gateway is not None:
        network["management_gateway"] = str(management.gateway)
    network["provisioning"] = [
        {"interface": p.interface, "address": f"{p.address}/{p.network.prefixlen}"}
        for p in answers.provisioning
    ]
    return network
