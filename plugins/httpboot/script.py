"""Per-machine iPXE scripts from boot profiles (sans-IO).

A profile names a kernel, its initrds and a command line. The script built
from it loads them over HTTP from this server and adds the two parameters an
installer needs to report back: ``rackboot.events=URL`` and
``rackboot.token=TOKEN`` (docs/httpboot.md). The ``httpboot_boot_script`` hook
may replace the result.
"""

from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass
from urllib.parse import quote

from .identity import url_mac

BOOT_PREFIX = "/boot/"
IMAGE = "image:"  # a profile's file named as an image of the store: image:NAME
IMAGES_PREFIX = "/images/"


@dataclass(frozen=True)
class Profile:
    name: str
    kernel: str  # a name under the root, image:NAME, an absolute URL, or "" for the local disk
    initrd: tuple[str, ...] = ()
    cmdline: str = ""


@dataclass(frozen=True)
class Machine:
    """Everything a boot script is made of, for the default renderer and for hooks."""

    mac: str  # aa:bb:cc:dd:ee:ff
    profile: Profile
    base_url: str  # http://address[:port], no trailing slash
    token: str
    client: str = ""  # the requesting address

    @property
    def events_url(self) -> str:
        return f"{self.base_url}/api/v1/machines/{url_mac(self.mac)}/events"

    def file_url(self, name: str) -> str:
        """A profile's file: an absolute URL as given, ``image:NAME`` the image store's
        current version of NAME (``/images/NAME``), else under ``/boot/`` of this server."""
        if "://" in name:
            return name
        if name.startswith(IMAGE):
            return self.base_url + IMAGES_PREFIX + quote(name.removeprefix(IMAGE), safe="-._~+")
        return self.base_url + BOOT_PREFIX + quote(name.lstrip("/"), safe="/-._~+")


def base_url(host: str, port: int) -> str:
    return f"http://{host}" if port == 80 else f"http://{host}:{port}"


def kernel_arguments(machine: Machine) -> str:
    """``initrd=NAME`` per initrd (Linux's EFI stub loads them by name), the
    profile's command line (``{mac}`` and ``{base}`` replaced), then the events
    parameters."""
    profile = machine.profile
    cmdline = profile.cmdline.replace("{mac}", machine.mac).replace("{base}", machine.base_url)
    own = [f"rackboot.events={machine.events_url}", f"rackboot.token={machine.token}"]
    return " ".join(part for part in (*_initrd_names(profile), cmdline.strip(), *own) if part)


@functools.lru_cache(maxsize=256)
def _initrd_names(profile: Profile) -> tuple[str, ...]:
    return tuple(f"initrd={posixpath.basename(name.removeprefix(IMAGE).rstrip('/'))}"
                 for name in profile.initrd)  # fmt: skip


@functools.lru_cache(maxsize=256)
def _file_urls(profile: Profile, base: str) -> tuple[str, tuple[str, ...]]:
    """The kernel's and the initrds' URLs: the same for every machine of a profile reaching
    this server at ``base`` (quoted once, not at every script)."""
    machine = Machine("", profile, base, "")
    return machine.file_url(profile.kernel), tuple(machine.file_url(n) for n in profile.initrd)


def render_ipxe(machine: Machine) -> str:
    before, after = _around_token(machine.mac, machine.profile, machine.base_url)
    return before if after is None else before + machine.token + after


@functools.lru_cache(maxsize=1024)
def _around_token(mac: str, profile: Profile, base: str) -> tuple[str, str | None]:
    """A machine's script but its token (last on the kernel line), made once: only the
    token changes from one boot to the next (None: no kernel, no token)."""
    lines = ["#!ipxe", f"# rackboot machine {mac} profile {profile.name}"]
    if not profile.kernel:
        lines.append("exit")  # back to the firmware: the next boot device (the local disk)
        return "\n".join(lines) + "\n", None
    kernel, initrds = _file_urls(profile, base)
    lines.append(f"kernel {kernel} {kernel_arguments(Machine(mac, profile, base, ''))}")
    after = [f"initrd {url}" for url in initrds]
    return "\n".join(lines), "\n" + "\n".join([*after, "boot"]) + "\n"
