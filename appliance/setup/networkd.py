"""``[network]``: the appliance's own addresses, and the systemd-networkd files made from
them (pure: settings in, file texts out; :mod:`.netapply` writes them).

`rackboot setup` asks for them and writes this section; the node itself does not read
it. The management interface gets its address and gateway; each provisioning interface
its address, with its subnet's prefix length. Interfaces setup does not name are left
alone by systemd-networkd (docs/setup.md, "The network").
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from appliance.errors import ConfigError
from appliance.schema import Field, IPv4Address, IPv4Interface, Section, Str, TableList

# Linux interface names: at most 15 bytes, no '/', ':' or whitespace (dev_valid_name).
INTERFACE_PATTERN = r"[A-Za-z0-9_.@+-]{1,15}"
_INTERFACE = Str(INTERFACE_PATTERN, "an interface name (at most 15 characters)")
FILE_PREFIX = "rackboot-"
# The images' own file of this name (buildroot/board/rackboot/rootfs-overlay) asks DHCP on
# every wired interface until setup has run; setup's file of the same name, which
# systemd-networkd reads instead, leaves the interfaces it does not configure alone.
UNCONFIGURED = f"99-{FILE_PREFIX}unconfigured.network"
WIRED = "en* eth*"

NETWORK = Section(
    "network",
    doc="This appliance's own addresses, asked by `rackboot setup`, which writes them as "
    "systemd-networkd files too (docs/setup.md); the node itself does not use them.",
    fields={
        "management_interface": Field(
            _INTERFACE,
            default=None,
            example="eth0",
            doc="Where the management address lives (none: setup configures no address).",
        ),
        "management_address": Field(
            IPv4Interface(),
            default=None,
            example="10.0.0.5/24",
            doc="This appliance's management address with its prefix length.",
        ),
        "management_gateway": Field(
            IPv4Address(),
            default=None,
            example="10.0.0.1",
            doc="The default route's gateway, on the management network (none: no default route).",
        ),
        "provisioning": Field(
            TableList(
                {
                    "interface": Field(_INTERFACE, example="eth1", doc="A provisioning interface."),
                    "address": Field(
                        IPv4Interface(),
                        example="10.1.0.5/24",
                        doc="This appliance's address there, with its subnet's prefix length.",
                    ),
                }
            ),
            default=(),
            doc="This appliance's address on each provisioning interface.",
        ),
    },
)


@dataclass(frozen=True)
class Link:
    """One interface's file: its addresses, and what kind of link it is."""

    interface: str
    addresses: tuple[ipaddress.IPv4Interface, ...]
    gateway: ipaddress.IPv4Address | None = None
    provisioning: bool = False


def links(network: Any) -> list[Link]:
    """The interfaces ``network`` (the validated section) configures, management first.
    One interface may be both: its file then carries both addresses."""
    found: dict[str, Link] = {}
    if network.management_interface:
        found[network.management_interface] = Link(
            network.management_interface, (network.management_address,),
            network.management_gateway,
        )  # fmt: skip
    for entry in network.provisioning:
        old = found.get(entry.interface, Link(entry.interface, ()))
        addresses = old.addresses + ((entry.address,) if entry.address not in old.addresses else ())
        found[entry.interface] = Link(entry.interface, addresses, old.gateway, provisioning=True)
    return list(found.values())


def check(network: Any, source: str) -> None:
    """What the kinds alone do not refuse (rackboot_configure)."""
    where = "network."
    if network.management_interface and network.management_address is None:
        raise ConfigError(source, where + "management_address", "an address with its prefix "
                          "length, since management_interface is set", has_found=False)  # fmt: skip
    if network.management_address is not None and not network.management_interface:
        raise ConfigError(source, where + "management_interface",
                          "the interface management_address is on", has_found=False)  # fmt: skip
    gateway = network.management_gateway
    if gateway is not None:
        if network.management_address is None:
            raise ConfigError(source, where + "management_gateway", "no gateway without a "
                              "management_address", str(gateway))  # fmt: skip
        if gateway not in network.management_address.network or (
            gateway == network.management_address.ip
        ):
            raise ConfigError(source, where + "management_gateway", "an address of "
                              f"{network.management_address.network} other than this "
                              "appliance's", str(gateway))  # fmt: skip
    seen: set[str] = set()
    for i, entry in enumerate(network.provisioning):
        if entry.interface in seen:
            raise ConfigError(source, f"{where}provisioning[{i}].interface",
                              "each interface once", entry.interface)  # fmt: skip
        seen.add(entry.interface)


def file_name(link: Link) -> str:
    return f"10-{FILE_PREFIX}{link.interface}.network"


def files(network: Any, source: str) -> dict[str, str]:
    """File name -> text, for a directory systemd-networkd reads; empty when ``network``
    configures no interface (setup then leaves the system's network as it is)."""
    configured = links(network)
    if not configured:
        return {}
    header = (f"# Written by `rackboot setup` from [network] in {source}:\n"
              "# change it there (run setup again), not here (docs/setup.md).\n")  # fmt: skip
    out = {file_name(link): header + link_text(link) for link in configured}
    out[UNCONFIGURED] = header + (
        "# Any other wired interface: systemd-networkd leaves it alone (no DHCP client\n"
        "# on a link setup was not told about).\n"
        f"[Match]\nName={WIRED}\n\n[Link]\nUnmanaged=yes\n"
    )
    return out


def link_text(link: Link) -> str:
    lines = [
        "[Match]", f"Name={link.interface}", "",
        # Online once its addresses are set, cable or not: the node binds them at start-up
        # (rackboot.service is ordered after network-online.target).
        "[Link]", "RequiredForOnline=no-carrier", "",
        "[Network]",
        *(f"Address={address}" for address in link.addresses),
    ]  # fmt: skip
    if link.gateway is not None:
        lines.append(f"Gateway={link.gateway}")
    lines += [
        "DHCP=no",
        # Static addresses stay through a pulled cable: nothing to renegotiate.
        "ConfigureWithoutCarrier=yes",
        "IgnoreCarrierLoss=yes",
    ]
    if link.provisioning:
        lines += [
            # The rack's machines do not configure the appliance.
            "IPv6AcceptRA=no",
            # The rack's VIP, which the node adds itself, survives a reload of these files.
            "KeepConfiguration=static",
        ]
    return "\n".join(lines) + "\n"
