"""Which first boot file a client gets (sans-IO): the default boot table.

=====================================  =========================  ==============
client says                            gets (``BootFiles`` key)   option 60 back
=====================================  =========================  ==============
user class ``iPXE`` (any arch)         ``ipxe_script`` (a URL)    its family
vendor ``HTTPClient``, arch 0x10       ``http_x64`` (a URL)       ``HTTPClient``
vendor ``HTTPClient``, arch 0x13       ``http_arm64`` (a URL)     ``HTTPClient``
vendor ``PXEClient``, arch 0 or none   ``bios`` (TFTP)            ``PXEClient``
vendor ``PXEClient``, arch 6           ``uefi_ia32`` (TFTP)       ``PXEClient``
vendor ``PXEClient``, arch 7 or 9      ``uefi_x64`` (TFTP)        ``PXEClient``
vendor ``PXEClient``, arch 0x0b        ``uefi_arm64`` (TFTP)      ``PXEClient``
anything else                          no boot answer
=====================================  =========================  ==============

iPXE is matched first so a chain-loaded iPXE gets its script instead of
loading itself again. A reservation's ``boot_file`` replaces the table's
answer for that machine, a subnet's ``[boot]`` table replaces the server's,
and the ``dhcp_boot_selection`` hook has the last word.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address

from .model import BootFiles

ARCH_BIOS = 0
ARCH_EFI_IA32 = 6
ARCH_EFI_X64 = 7
ARCH_EFI_BC = 9  # "EFI byte code", sent by x64 firmware in practice
ARCH_EFI_ARM64 = 0x0B
ARCH_HTTP_X64 = 0x10
ARCH_HTTP_ARM64 = 0x13

_PXE_FILES = {
    ARCH_BIOS: "bios",
    ARCH_EFI_IA32: "uefi_ia32",
    ARCH_EFI_X64: "uefi_x64",
    ARCH_EFI_BC: "uefi_x64",
    ARCH_EFI_ARM64: "uefi_arm64",
}
_HTTP_FILES = {ARCH_HTTP_X64: "http_x64", ARCH_HTTP_ARM64: "http_arm64"}


@dataclass(frozen=True)
class BootRequest:
    """What a client tells about its firmware."""

    mac: str  # "aa:bb:cc:dd:ee:ff", or "" for non-Ethernet
    arches: tuple[int, ...]  # option 93
    vendor_class: bytes  # option 60
    user_classes: tuple[bytes, ...]  # option 77
    subnet: str  # the subnet serving it


@dataclass(frozen=True)
class BootChoice:
    """The boot part of a reply: option 67 and ``file``; ``server`` in ``siaddr`` and option 66."""

    kind: str  # the BootFiles key that chose it, "reservation", or a hook's name
    file: str  # a TFTP path or a URL
    server: IPv4Address
    vendor_class: bytes = b""  # option 60 in the reply ("PXEClient"/"HTTPClient"), b"" for none


def choose_boot(
    request: BootRequest, files: BootFiles, server: IPv4Address, override: str = ""
) -> BootChoice | None:
    """The default table above; ``override`` (a reservation's boot file) wins for booting clients."""
    vendor = request.vendor_class
    arch = request.arches[0] if request.arches else None
    if b"iPXE" in request.user_classes:
        kind, echo = "ipxe_script", _family(vendor)
    elif vendor.startswith(b"HTTPClient") and arch in _HTTP_FILES:
        kind, echo = _HTTP_FILES[arch], b"HTTPClient"
    elif vendor.startswith(b"PXEClient") and (arch is None or arch in _PXE_FILES):
        kind, echo = _PXE_FILES[arch or ARCH_BIOS], b"PXEClient"
    else:
        return None
    if override:
        return BootChoice("reservation", render(override, server, request.mac), server, echo)
    template = getattr(files, kind)
    if not template:
        return None
    return BootChoice(kind, render(template, server, request.mac), server, echo)


def _family(vendor: bytes) -> bytes:
    for family in (b"PXEClient", b"HTTPClient"):
        if vendor.startswith(family):
            return family
    return b""


def render(template: str, server: IPv4Address, mac: str) -> str:
    return template.replace("{server}", str(server)).replace("{mac}", mac.replace(":", "-"))
