"""The installer the VM boots: an initramfs made in Python from a static busybox,
the NIC's kernel modules and a short ``/init``.

``/init`` loads the modules, takes an address with ``udhcpc``, reads the
``rackboot.*`` parameters of the kernel command line and POSTs the ``installed``
event as docs/httpboot.md says an installer does: to ``rackboot.events=URL``,
with ``Authorization: Bearer`` and ``rackboot.token=TOKEN``, using ``busybox
wget`` (``--header``, ``--post-data``). It prints ``RACKBOOT-INSTALLER:``
markers on the serial console and powers the VM off, on success or failure
alike, so nobody waits for a timeout to learn the outcome.

Faulty hardware for the provisioning tests, chosen by the VM's MAC on the kernel
command line: ``rackboot.test.fail=MAC[,MAC]`` posts a ``failed`` event and powers
off; ``rackboot.test.hang=MAC[,MAC]`` posts ``started`` and never says anything again.

The archive is cpio ``newc`` (the format the kernel unpacks), gzipped.
"""

from __future__ import annotations

import gzip
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .debs import Kernel

MARK = "RACKBOOT-INSTALLER:"
# Kernel options for the NIC QEMU gives the VM (virtio-net-pci), and their modules.
NIC_DRIVERS = (("VIRTIO_PCI", "virtio_pci"), ("VIRTIO_NET", "virtio_net"))
MODINFO_CAP = 4 << 20  # a module larger than this is not one we need


@dataclass(frozen=True)
class Event:
    """What /init posts: the kernel parameters name the URL and the token, not this."""

    stage: str = "installed"
    status: str = "ok"
    message: str = "rackboot lab installer finished"  # no quote: /init single-quotes it


def build(kernel: Kernel, busybox: Path, out: Path, *, event: Event = Event()) -> Path:
    """Write the gzipped initramfs to ``out``; the NIC modules are those not built in."""
    modules = module_chain(
        kernel.modules, [m for opt, m in NIC_DRIVERS if not kernel.built_in(opt)]
    )
    archive = Newc()
    for d in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "tmp",
              "lib", "lib/modules"):  # fmt: skip
        archive.directory(d)
    archive.char_device("dev/console", 5, 1)
    archive.file("bin/busybox", busybox.read_bytes(), 0o755)
    archive.symlink("bin/sh", "busybox")
    for path in modules:
        archive.file(f"lib/modules/{path.name}", path.read_bytes(), 0o644)
    archive.file("etc/udhcpc.sh", UDHCPC_SCRIPT.encode(), 0o755)
    archive.file("init", init_script([p.name for p in modules], event).encode(), 0o755)
    out.write_bytes(gzip.compress(archive.finish(), compresslevel=6, mtime=0))
    return out


def module_chain(modules: Path, names: Iterable[str]) -> list[Path]:
    """The ``.ko`` files of ``names`` and everything they depend on, dependencies first.

    Dependencies come from each module's ``.modinfo`` (``depends=``): the unpacked
    package has no ``modules.dep`` (depmod runs at install time)."""
    by_name = {p.name.removesuffix(".ko").replace("-", "_"): p for p in modules.rglob("*.ko")}
    ordered: list[Path] = []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in trail:
            raise ValueError(f"module dependency loop: {' -> '.join((*trail, name))}")
        path = by_name.get(name)
        if path is None:
            raise FileNotFoundError(f"module {name}.ko not under {modules}")
        if path in ordered:
            return
        for dep in depends(path):
            visit(dep, (*trail, name))
        ordered.append(path)

    for name in names:
        visit(name.replace("-", "_"), ())
    return ordered


def depends(ko: Path) -> list[str]:
    """The ``depends=`` entry of a module's ``.modinfo`` strings (NUL-separated)."""
    data = ko.read_bytes()[:MODINFO_CAP]
    for field in data.split(b"\0"):
        if field.startswith(b"depends="):
            value = field[len(b"depends=") :].decode("ascii")
            return [d.replace("-", "_") for d in value.split(",") if d]
    return []


class Newc:
    """A cpio archive in the ``newc`` format (what the kernel unpacks as an initramfs)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._ino = 0

    def directory(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755, b"", nlink=2)

    def file(self, name: str, data: bytes, mode: int) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def char_device(self, name: str, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | 0o600, b"", rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0, b"", ino=0)
        return b"".join(self._parts)

    def _entry(self, name: str, mode: int, data: bytes, *, nlink: int = 1,
               rdev: tuple[int, int] = (0, 0), ino: int | None = None) -> None:  # fmt: skip
        if ino is None:
            self._ino += 1
            ino = self._ino
        raw = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, nlink, 0, len(data), 0, 0, *rdev, len(raw), 0)
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        self._parts += [header, raw, _pad(len(header) + len(raw)), data, _pad(len(data))]


def _pad(size: int) -> bytes:
    return b"\0" * (-size % 4)


UDHCPC_SCRIPT = """#!/bin/sh
case "$1" in
  deconfig) ip -4 addr flush dev "$interface"; ip link set "$interface" up ;;
  bound|renew)
    ip addr replace "$ip/$mask" dev "$interface"
    echo "$ip" > /tmp/address ;;
esac
exit 0
"""


def init_script(modules: list[str], event: Event) -> str:
    """``/init``: ``rackboot.events=`` and ``rackboot.token=`` as docs/httpboot.md names them."""
    body = (f'{{"stage": "{event.stage}", "status": "{event.status}", '
            f'"message": "{event.message}"}}')  # fmt: skip
    failed = '{"stage": "install", "status": "failed", "message": "no disk (rackboot.test.fail)"}'
    started = '{"stage": "install", "status": "started", "message": "partitioning"}'
    return f"""#!/bin/sh
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
say() {{ echo "{MARK} $*"; }}
finish() {{ say "$1"; sync; poweroff -f; sleep 5; exit 1; }}
say "init started, kernel $(uname -r)"
for ko in {" ".join(modules)}; do insmod "/lib/modules/$ko" || finish "FAILED insmod $ko"; done
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    rackboot.events=*) RB_events="${{arg#rackboot.events=}}" ;;
    rackboot.token=*) RB_token="${{arg#rackboot.token=}}" ;;
    rackboot.test.fail=*) RB_fail="${{arg#rackboot.test.fail=}}" ;;
    rackboot.test.hang=*) RB_hang="${{arg#rackboot.test.hang=}}" ;;
  esac
done
nic=""
for i in $(seq 50); do
  for d in /sys/class/net/*; do [ "${{d##*/}}" = lo ] || nic=${{d##*/}}; done
  [ -n "$nic" ] && break
  usleep 100000
done
[ -n "$nic" ] || finish "FAILED no network interface"
mac=$(cat /sys/class/net/$nic/address)
ip link set lo up
ip link set "$nic" up
udhcpc -i "$nic" -s /etc/udhcpc.sh -n -q -t 20 -T 1 -A 1 >/dev/null 2>&1 || finish "FAILED no DHCP lease"
say "address $(cat /tmp/address) on $nic mac $mac"
[ -n "$RB_events" ] || finish "FAILED no rackboot.events= parameter"
set -- --header "Content-Type: application/json"
[ -n "$RB_token" ] && set -- "$@" --header "Authorization: Bearer $RB_token"
# Faulty hardware, by MAC (tests of the provisioning workflow): hang, or fail.
case ",$RB_hang," in *",$mac,"*)
  wget -q -O /tmp/reply "$@" --post-data '{started}' "$RB_events"
  say "hanging (rackboot.test.hang)"; while :; do sleep 60; done ;;
esac
case ",$RB_fail," in *",$mac,"*)
  wget -q -O /tmp/reply "$@" --post-data '{failed}' "$RB_events"
  finish "FAILED on purpose (rackboot.test.fail), powering off" ;;
esac
if wget -q -O /tmp/reply "$@" --post-data '{body}' "$RB_events"; then
  say "event posted to $RB_events: $(cat /tmp/reply)"
  finish "installed, powering off"
fi
finish "FAILED to post the event to $RB_events"
"""
