"""The ``[relay]`` configuration section and its translation into :class:`RelayConfig`.

Off unless both ``servers`` and ``interfaces`` are given (the safe default: a
node relays nothing it was not told to). Interface addresses left empty are
read from the interfaces when the relay starts.
"""

from __future__ import annotations

from ipaddress import IPv4Address as Address
from typing import Any

from appliance.api import Bool, Choice, Field, Int, IPv4Address, List, Section, Str, TableList
from appliance.errors import ConfigError

from .agent import Link, RelayConfig

_IFNAME = r"[A-Za-z0-9_.:@-]{1,15}"

_INTERFACE = {
    "name": Field(
        Str(_IFNAME, "an interface name"), doc="A client-facing interface.", example="vlan101"
    ),  # fmt: skip
    "address": Field(
        IPv4Address(),
        default=None,
        doc="giaddr for this interface (default: its first IPv4 address when the relay starts).",
    ),  # fmt: skip
    "circuit_id": Field(
        Str(max_len=255), default="", doc="Option 82 circuit-id (default: the interface's name)."
    ),
    "remote_id": Field(Str(max_len=255), default="", doc="Option 82 remote-id (default: none)."),
    "link_selection": Field(
        Bool(),
        default=False,
        doc="RFC 3527: giaddr is relay.source, sub-option 5 names this interface's subnet.",
    ),  # fmt: skip
    "server_id_override": Field(
        Bool(),
        default=False,
        doc="RFC 5107: clients renew through this interface's address (sub-option 11).",
    ),  # fmt: skip
}


def _relaying(settings: Any) -> bool:
    return bool(settings.servers and settings.interfaces)


SECTION = Section(
    "relay",
    doc="DHCP relay agent: client-facing interfaces relayed to DHCP servers (docs/relay.md).",
    fields={
        "servers": Field(
            List(IPv4Address()),
            default=(),
            doc="DHCP servers to relay to: the site's, or a rack's VIP (none: no relay).",
        ),  # fmt: skip
        "interfaces": Field(TableList(_INTERFACE), default=(), doc="Client-facing interfaces."),
        "when": Field(
            Choice("always", "active"),
            default="always",
            doc="'always': every appliance relays (it is stateless); 'active': only the one "
            "holding the rack's lease.",
        ),  # fmt: skip
        "max_hops": Field(
            Int(min=1, max=16),
            default=4,
            doc="Requests that have passed this many relays: dropped.",
        ),
        "port": Field(Int(min=1, max=65535), default=67, doc="Server port (listened and sent to)."),
        "client_port": Field(Int(min=1, max=65535), default=68, doc="Client port."),
        "source": Field(
            IPv4Address(),
            default=None,
            doc="This relay's upstream address: giaddr of interfaces with link_selection.",
        ),  # fmt: skip
        "trust_option82": Field(
            Bool(),
            default=False,
            doc="Relay a client's request that carries option 82 already (default: drop it).",
        ),  # fmt: skip
    },
    # No Listener: one socket on 0.0.0.0:port beside the DHCP server's, which are bound to
    # their interfaces (SO_REUSEADDR on both); check_beside_dhcp keeps their interfaces apart.
)


def check_beside_dhcp(relay: Any, dhcp: Any | None, source: str) -> None:
    """The DHCP server of this node must not serve an interface the relay relays (both
    would answer its clients)."""
    if dhcp is None or not dhcp.enabled or not _relaying(relay) or dhcp.port != relay.port:
        return
    for i, item in enumerate(relay.interfaces):
        if item.name in dhcp.interfaces:
            raise ConfigError(source, f"relay.interfaces[{i}].name",
                              "an interface dhcp.interfaces does not list (the DHCP server "
                              "of this node answers there itself)", item.name)  # fmt: skip


def relay_config(relay: Any, source: str, addresses: dict[str, int]) -> RelayConfig:
    """``RelayConfig`` from the validated settings; ``addresses``: each interface's own
    address (for those the configuration leaves empty). ConfigError names the key."""
    links, seen = [], set()
    for i, item in enumerate(relay.interfaces):
        path = f"relay.interfaces[{i}]"
        if item.name in seen:
            raise ConfigError(source, f"{path}.name", "each interface once", item.name)
        seen.add(item.name)
        address = int(item.address) if item.address is not None else addresses.get(item.name, 0)
        if not address:
            raise ConfigError(source, f"{path}.address", f"an IPv4 address ({item.name} has "
                              "none: give one, or configure the interface)", has_found=False)  # fmt: skip
        if item.link_selection and relay.source is None:
            raise ConfigError(source, "relay.source", f"an address (interface {item.name} "
                              "uses link_selection: it is the giaddr)", has_found=False)  # fmt: skip
        link = Link(item.name, address, (item.circuit_id or item.name).encode(),
                    item.remote_id.encode(), item.link_selection, item.server_id_override)  # fmt: skip
        try:
            link.option82()
        except ValueError as exc:
            raise ConfigError(source, path, "option 82 of at most 255 bytes", str(exc)) from None
        links.append(link)
    circuits = [link.circuit_id for link in links]
    if len(set(circuits)) != len(circuits):
        raise ConfigError(source, "relay.interfaces", "a distinct circuit_id per interface",
                          ", ".join(c.decode() for c in circuits))  # fmt: skip
    return RelayConfig(
        links=tuple(links),
        servers=tuple(int(Address(s)) for s in relay.servers),
        source=int(relay.source) if relay.source is not None else 0,
        max_hops=relay.max_hops,
        trust_option82=relay.trust_option82,
    )
