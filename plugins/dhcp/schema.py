"""The ``[dhcp]`` configuration section and its translation into :class:`ServerConfig`.

The schema checks each value; :func:`server_config` checks what spans keys
(pools inside their network, no overlaps, reservations inside a subnet) and
names the key path of any problem.
"""

from __future__ import annotations

from ipaddress import IPv4Address as Address
from ipaddress import IPv4Network as Network
from typing import Any

from appliance.api import (
    Bool,
    Choice,
    Field,
    Float,
    Int,
    IPv4Address,
    IPv4Network,
    List,
    Section,
    Str,
    Table,
    TableList,
)
from appliance.errors import ConfigError
from appliance.schema import Listener

from .model import BootFiles, Reservation, ServerConfig, Subnet

_RANGE = r"\d+\.\d+\.\d+\.\d+-\d+\.\d+\.\d+\.\d+"
_ROUTE = r"\d+\.\d+\.\d+\.\d+/\d+ via \d+\.\d+\.\d+\.\d+"
_MAC = r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}"
_HEX = r"([0-9a-fA-F]{2}:?)+"
_HOSTNAME = r"[A-Za-z0-9]([A-Za-z0-9.-]{0,62})"


def _boot_fields(defaults: BootFiles | None) -> dict[str, Field]:
    def field(name: str, doc: str) -> Field:
        return Field(Str(), default=getattr(defaults, name) if defaults else None, doc=doc)

    return {
        "bios": field("bios", "TFTP path for BIOS PXE (arch 0)."),
        "uefi_ia32": field("uefi_ia32", "TFTP path for 32-bit x86 UEFI PXE (arch 6)."),
        "uefi_x64": field("uefi_x64", "TFTP path for x64 UEFI PXE (arch 7 and 9)."),
        "uefi_arm64": field("uefi_arm64", "TFTP path for ARM64 UEFI PXE (arch 11)."),
        "http_x64": field("http_x64", "URL for x64 UEFI HTTP boot (arch 16)."),
        "http_arm64": field("http_arm64", "URL for ARM64 UEFI HTTP boot (arch 19)."),
        "ipxe_script": field(
            "ipxe_script", "URL handed to iPXE (user class 'iPXE') so it never loads itself again."
        ),
    }


_SUBNET = {
    "network": Field(IPv4Network(), doc="The subnet, e.g. '192.0.2.0/24'.", example="192.0.2.0/24"),
    "pools": Field(
        List(Str(_RANGE, "an address range 'first-last'")),
        default=(),
        doc="Dynamic address ranges, 'first-last' inclusive.",
        example=["192.0.2.100-192.0.2.199"],
    ),
    "router": Field(IPv4Address(), default=None, doc="Default gateway (option 3)."),
    "dns": Field(List(IPv4Address()), default=(), doc="DNS servers (option 6)."),
    "domain": Field(Str(_HOSTNAME, "a domain name"), default=None, doc="Domain name (option 15)."),
    "ntp": Field(List(IPv4Address()), default=(), doc="NTP servers (option 42)."),
    "mtu": Field(Int(min=68, max=65535), default=None, doc="Interface MTU (option 26)."),
    "routes": Field(
        List(Str(_ROUTE, "a route 'network/len via gateway'")),
        default=(),
        doc="Classless static routes (option 121), e.g. '10.0.0.0/8 via 192.0.2.254'.",
    ),
    "lease_time": Field(Int(min=60, max=2**31), default=None, doc="Overrides dhcp.lease_time."),
    "interface": Field(Str(), default=None, doc="Serve this subnet only on this interface."),
    "boot_server": Field(IPv4Address(), default=None, doc="Overrides dhcp.boot_server."),
    "boot": Field(Table(_boot_fields(None)), default=None, doc="Overrides dhcp.boot per key."),
}

_RESERVATION = {
    "address": Field(IPv4Address(), doc="The machine's fixed address.", example="192.0.2.10"),
    "mac": Field(
        Str(_MAC, "a MAC address 'aa:bb:cc:dd:ee:ff'"),
        default=None,
        doc="Match by MAC (give mac or client_id).",
        example="52:54:00:12:34:56",
    ),
    "client_id": Field(
        Str(_HEX, "hex bytes such as '01:aa:bb:cc:dd:ee:ff'"),
        default=None,
        doc="Match by client identifier (option 61), in hex.",
    ),
    "hostname": Field(Str(_HOSTNAME, "a host name"), default=None, doc="Host name (option 12)."),
    "boot_file": Field(Str(), default=None, doc="Boot file or URL for this machine."),
    "profile": Field(Str(), default=None, doc="Boot profile for the HTTP-boot scripts."),
}

_DEV_SUBNET = {"network": "127.0.0.0/8", "pools": ["127.0.100.10-127.0.100.250"]}
# The no-config node serves HTTP boot on 8080 (the httpboot plugin's dev port), so
# its boot URLs name that port; a configured node's default to port 80.
_DEV_BOOT = {
    key: getattr(BootFiles(), key).replace("{server}", "{server}:8080")
    for key in ("http_x64", "http_arm64", "ipxe_script")
}

SECTION = Section(
    "dhcp",
    doc="DHCPv4 server for the rack's machines.",
    fields={
        "enabled": Field(Bool(), default=True, doc="Serve DHCP at all."),
        "interfaces": Field(
            List(Str(r"[A-Za-z0-9_.:@-]{1,15}", "an interface name")),
            default=(),
            dev_default=("lo",),
            doc="Interfaces to serve on (none: DHCP does not start). Needs root for port 67.",
        ),
        "port": Field(Int(min=1, max=65535), default=67, dev_default=6767, doc="Server port."),
        "client_port": Field(
            Int(min=1, max=65535), default=68, dev_default=6868, doc="Client port."
        ),
        "server_address": Field(
            IPv4Address(), default=None, doc="Server identifier (default: the interface's address)."
        ),
        "boot_server": Field(
            IPv4Address(),
            default=None,
            doc="Where boot files are served (siaddr, option 66; default: the server identifier).",
        ),
        "lease_time": Field(Int(min=60, max=2**31), default=3600, doc="Lease time in seconds."),
        "offer_hold": Field(
            Float(min=1.0, max=300.0), default=10.0, doc="Seconds an offered address is held."
        ),
        "decline_quarantine": Field(
            Int(min=0, max=2**31), default=3600, doc="Seconds a declined address stays unused."
        ),
        "authoritative": Field(
            Bool(), default=True, doc="NAK requests for addresses of our subnets we did not lease."
        ),
        "probe": Field(
            Choice("none", "icmp"),
            default="none",
            doc="Ping a dynamic address before offering it ('icmp' needs root).",
        ),
        "probe_timeout": Field(
            Float(min=0.05, max=5.0), default=0.5, doc="Seconds to wait for a probe's answer."
        ),
        "boot": Field(
            Table(_boot_fields(BootFiles())),
            default={},
            dev_default=_DEV_BOOT,
            doc="The boot table.",
        ),
        "subnets": Field(
            TableList(_SUBNET), default=(), dev_default=[_DEV_SUBNET], doc="Subnets served."
        ),
        "reservations": Field(TableList(_RESERVATION), default=(), doc="Fixed addresses."),
    },
    # One socket per interface, each on every address of it (SO_BINDTODEVICE).
    listeners=(Listener("udp", port="port", enabled="enabled"),),
)


def server_config(dhcp: Any, source: str) -> ServerConfig:
    """``ServerConfig`` from the validated ``[dhcp]`` settings; ConfigError names the key."""
    boot = _boot(dhcp.boot, BootFiles())
    subnets = tuple(
        _subnet(s, f"dhcp.subnets[{i}]", source, boot) for i, s in enumerate(dhcp.subnets)
    )
    _check_overlaps(subnets, source)
    reservations = tuple(
        _reservation(r, f"dhcp.reservations[{i}]", source, subnets)
        for i, r in enumerate(dhcp.reservations)
    )
    return ServerConfig(
        subnets=subnets,
        reservations=reservations,
        lease_time=dhcp.lease_time,
        offer_hold=dhcp.offer_hold,
        decline_quarantine=dhcp.decline_quarantine,
        authoritative=dhcp.authoritative,
        server_address=dhcp.server_address,
        boot_server=dhcp.boot_server,
        boot=boot,
        server_port=dhcp.port,
        client_port=dhcp.client_port,
        probe=dhcp.probe != "none",
    )


def _boot(table: Any, base: BootFiles) -> BootFiles:
    values = {k: v for k, v in dict(table).items() if v is not None}
    return BootFiles(**{**vars(base), **values})


def _subnet(s: Any, path: str, source: str, boot: BootFiles) -> Subnet:
    net: Network = s.network
    if net.prefixlen > 30:
        raise ConfigError(
            source, f"{path}.network", "a network of at least 4 addresses (/30)", str(net)
        )
    pools = []
    for i, text in enumerate(s.pools):
        first, last = (Address(part) for part in text.split("-"))
        if not (first <= last and s_contains(net, first) and s_contains(net, last)):
            raise ConfigError(
                source, f"{path}.pools[{i}]", f"a range first <= last inside {net}", text
            )
        pools.append((int(first), int(last)))
    pools.sort()
    for (_, high), (low, _) in zip(pools, pools[1:], strict=False):
        if low <= high:
            raise ConfigError(source, f"{path}.pools", "ranges that do not overlap", list(s.pools))
    routes = []
    for i, text in enumerate(s.routes):
        dest, _, gateway = text.partition(" via ")
        try:
            routes.append((Network(dest), Address(gateway)))
        except ValueError:
            raise ConfigError(
                source,
                f"{path}.routes[{i}]",
                "'network/len via gateway' with host bits clear",
                text,
            ) from None
    return Subnet(
        network=net,
        pools=tuple(pools),
        router=s.router,
        dns=tuple(s.dns),
        domain=s.domain or "",
        ntp=tuple(s.ntp),
        mtu=s.mtu,
        routes=tuple(routes),
        lease_time=s.lease_time,
        interface=s.interface or "",
        boot_server=s.boot_server,
        boot=_boot(s.boot, boot) if s.boot is not None else None,
    )


def s_contains(net: Network, address: Address) -> bool:
    return net.network_address < address < net.broadcast_address


def _check_overlaps(subnets: tuple[Subnet, ...], source: str) -> None:
    for i, a in enumerate(subnets):
        for j, b in enumerate(subnets[:i]):
            if a.network.overlaps(b.network):
                raise ConfigError(
                    source,
                    f"dhcp.subnets[{i}].network",
                    f"a network not overlapping dhcp.subnets[{j}] ({b.network})",
                    str(a.network),
                )


def _reservation(r: Any, path: str, source: str, subnets: tuple[Subnet, ...]) -> Reservation:
    if (r.mac is None) == (r.client_id is None):
        raise ConfigError(source, path, "exactly one of 'mac' or 'client_id'", has_found=False)
    address = int(r.address)
    if not any(s.contains(address) for s in subnets):
        raise ConfigError(
            source, f"{path}.address", "an address inside one of dhcp.subnets", str(r.address)
        )
    return Reservation(
        address=address,
        mac=bytes.fromhex(r.mac.replace(":", "")) if r.mac else None,
        client_id=bytes.fromhex(r.client_id.replace(":", "")) if r.client_id else None,
        hostname=r.hostname or "",
        boot_file=r.boot_file or "",
        profile=r.profile or "",
    )
