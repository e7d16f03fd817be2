"""What the DHCP server serves, as plain values (sans-IO).

:mod:`plugins.dhcp.schema` builds these from the validated ``[dhcp]`` section;
tests build them directly. Addresses are integers on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from ipaddress import IPv4Address, IPv4Network


@dataclass(frozen=True)
class BootFiles:
    """Where each kind of firmware finds its first boot file (see plugins/dhcp/boot.py).

    A value is a TFTP path, or for HTTP boot and iPXE a URL; ``{server}`` is
    replaced by the boot server's address and ``{mac}`` by the client's MAC
    as ``aa-bb-cc-dd-ee-ff``. An empty value means: no boot answer for that kind.
    """

    bios: str = "undionly.kpxe"
    uefi_ia32: str = "ipxe-i386.efi"
    uefi_x64: str = "ipxe.efi"
    uefi_arm64: str = "ipxe-arm64.efi"
    http_x64: str = "http://{server}/boot/ipxe.efi"
    http_arm64: str = "http://{server}/boot/ipxe-arm64.efi"
    ipxe_script: str = "http://{server}/boot/{mac}.ipxe"


@dataclass(frozen=True)
class Reservation:
    """A fixed address for one machine, by MAC or by client identifier."""

    address: int
    mac: bytes | None = None  # 6 bytes
    client_id: bytes | None = None  # option 61 as sent
    hostname: str = ""
    boot_file: str = ""  # overrides the boot table for this machine
    profile: str = ""  # for the HTTP-boot plugin's scripts


@dataclass(frozen=True)
class Subnet:
    network: IPv4Network
    pools: tuple[tuple[int, int], ...] = ()  # inclusive ranges
    router: IPv4Address | None = None
    dns: tuple[IPv4Address, ...] = ()
    domain: str = ""
    ntp: tuple[IPv4Address, ...] = ()
    mtu: int | None = None
    routes: tuple[tuple[IPv4Network, IPv4Address], ...] = ()
    lease_time: int | None = None  # None: the server's
    interface: str = ""  # serve only requests arriving here ('' = any that matches)
    boot_server: IPv4Address | None = None
    boot: BootFiles | None = None  # None: the server's

    # Computed once per subnet (the server asks several times per packet); cached_property
    # stores into the instance dict, which a frozen dataclass without slots allows.
    @cached_property
    def key(self) -> str:
        return str(self.network)

    @cached_property
    def _host_range(self) -> tuple[int, int]:
        """The network and broadcast addresses as integers: hosts lie strictly between."""
        return int(self.network.network_address), int(self.network.broadcast_address)

    def contains(self, address: int) -> bool:
        low, high = self._host_range
        return low < address < high

    def in_pool(self, address: int) -> bool:
        for low, high in self.pools:  # noqa: SIM110 - any(<genexpr>) costs 3x more per call
            if low <= address <= high:
                return True
        return False

    @property
    def pool_size(self) -> int:
        return sum(high - low + 1 for low, high in self.pools)


@dataclass(frozen=True)
class ServerConfig:
    subnets: tuple[Subnet, ...]
    reservations: tuple[Reservation, ...] = ()
    lease_time: int = 3600
    offer_hold: float = 10.0  # seconds an offered address stays set aside for its client
    decline_quarantine: int = 3600
    authoritative: bool = True
    server_address: IPv4Address | None = None  # server identifier override
    boot_server: IPv4Address | None = None  # siaddr / option 66 (default: the server id)
    # The rack's virtual IP ([ha] vip, without prefix): the server identifier, the boot
    # server's default and where the active's replies leave from.
    vip: IPv4Address | None = None
    boot: BootFiles = field(default_factory=BootFiles)
    server_port: int = 67
    client_port: int = 68
    probe: bool = False  # ping a dynamic address before offering it
