"""A QEMU VM on the lab's network: its own namespace, a tap bridged to the lab bridge.

::

    [ns vm]  qemu -netdev tap --- tap-<id> --- bridge brvm --- vm-<id> --veth-- lab bridge

The VM's NIC talks to Rackboot's real sockets through the lab (no user-mode or
socket networking). Firmware: ``bios`` (SeaBIOS; the NIC's option ROM is iPXE
from ``ipxe-qemu``) or ``uefi`` (OVMF, no option ROM: the firmware's own
network stack; its PXE boot options are switched off through ``fw_cfg`` so HTTP
boot is the first thing it tries instead of after ~2 minutes of PXE timeouts).

The serial console goes to a file; :class:`Console` stamps each line with the
seconds since power-on as it is first read. Everything waits with a deadline,
and QEMU is stopped by its own PID.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from appliance.lab.netns import Host, Lab, LabError
from appliance.lab.processes import POLL, Timeout, stop_process

QEMU = "qemu-system-x86_64"
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
IPXE_ROM = Path("/usr/lib/ipxe/qemu/efi-virtio.rom")  # ipxe-qemu: what QEMU loads for virtio-net
ACCEL_ENV = "RACKBOOT_NETBOOT_ACCEL"  # "kvm" to use KVM (when /dev/kvm works); default TCG
KVM_GET_API_VERSION, KVM_CREATE_VM = 0xAE00, 0xAE01
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1bc")


class VmExited(LabError):
    """QEMU ended before the console showed what was waited for."""


def missing() -> str | None:
    """Why a VM cannot run here, or None."""
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (no tap devices for the VM)"
    if not shutil.which(QEMU):
        return f"{QEMU} is not installed (Debian package qemu-system-x86)"
    for path, package in ((IPXE_ROM, "ipxe-qemu"), (OVMF_CODE, "ovmf")):
        if not path.exists():
            return f"{path} is missing (Debian package {package})"
    return None


def accelerator(want: str | None = None) -> tuple[str, str]:
    """``("tcg" | "kvm", why)``. TCG unless KVM is asked for (``want``, else
    ``$RACKBOOT_NETBOOT_ACCEL=kvm``) and /dev/kvm works.

    KVM is opt-in because "/dev/kvm creates a VM" does not mean it runs one well:
    on the nested KVM of the machines this project runs on, SeaBIOS took ~6 s to
    print its banner, iPXE ~85 s to start, and the guest then reset; under TCG
    the whole netboot takes ~40 s."""
    asked = f"{want} asked" if want else f"${ACCEL_ENV}={os.environ.get(ACCEL_ENV, '')}"
    if (want or os.environ.get(ACCEL_ENV, "")) != "kvm":
        return "tcg", "the default (KVM only when asked for)"
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return "tcg", f"{asked} but /dev/kvm: {errno.errorcode.get(exc.errno or 0, exc)}"
    try:
        if fcntl.ioctl(fd, KVM_GET_API_VERSION) != 12:
            return "tcg", f"{asked} but /dev/kvm speaks an unknown API version"
        os.close(fcntl.ioctl(fd, KVM_CREATE_VM, 0))
    except OSError as exc:
        return "tcg", f"{asked} but /dev/kvm cannot create a VM: {exc}"
    finally:
        os.close(fd)
    return "kvm", f"{asked} and /dev/kvm creates VMs"


def vm_host(lab: Lab) -> tuple[Host, str]:
    """A namespace on the lab for the VM, with a tap bridged to its lab link: (host, tap name)."""
    host, (tap,) = vms_host(lab, 1)
    return host, tap


def vms_host(lab: Lab, count: int) -> tuple[Host, list[str]]:
    """A namespace on the lab for ``count`` VMs, a tap each, all bridged to its lab link."""
    host = lab.add_host("vm", bare=True)
    taps, bridge = [f"tap{i}-{lab.id}"[:15] for i in range(count)], "brvm"
    steps = [
        ["link", "add", bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0",
         "mcast_snooping", "0"],
        ["link", "set", host.ifname, "master", bridge],
    ]  # fmt: skip
    for tap in taps:
        steps += [["tuntap", "add", "dev", tap, "mode", "tap"],
                  ["link", "set", tap, "master", bridge, "up"]]  # fmt: skip
    for args in [*steps, ["link", "set", bridge, "up"]]:
        res = host.run(["ip", *args], timeout=10)
        if res.returncode != 0:
            raise LabError(f"ip {' '.join(args)} in {host.ns}: {res.stderr.strip()}")
    return host, taps


@dataclass
class Console:
    """The serial log, read as it grows; each line stamped with seconds since power-on."""

    path: Path
    t0: float  # time.monotonic() at power-on
    lines: list[tuple[float, str]] = field(default_factory=list)
    _offset: int = 0
    _partial: str = ""

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        now = time.monotonic() - self.t0
        parts = re.split(r"[\r\n]", self._partial + chunk.decode("latin-1"))
        self._partial = parts.pop()
        for raw in parts:
            text = _erase(ANSI.sub("", raw)).strip()
            if text:
                self.lines.append((now, text))

    def find(self, pattern: str) -> tuple[float, str] | None:
        """The first line matching ``pattern`` (a regular expression) so far."""
        rx = re.compile(pattern)
        return next(((t, line) for t, line in self.lines if rx.search(line)), None)

    def text(self) -> str:
        return "\n".join(f"{t:8.3f} {line}" for t, line in self.lines)


def _erase(text: str) -> str:
    """Apply backspaces, as a terminal shows them (iPXE's countdowns and progress use them)."""
    if "\b" not in text:
        return text
    out: list[str] = []
    for ch in text:
        if ch != "\b":
            out.append(ch)
        elif out:
            out.pop()
    return "".join(out)


class Vm:
    """One QEMU process on ``host`` (see :func:`vm_host`), not started until :meth:`start`."""

    def __init__(self, host: Host, tap: str, workdir: Path, *, firmware: str, mac: str,
                 accel: str, memory_mb: int = 512, qmp: Path | None = None) -> None:  # fmt: skip
        if firmware not in ("bios", "uefi"):
            raise ValueError(f"firmware must be 'bios' or 'uefi', not {firmware!r}")
        self.host, self.tap, self.workdir = host, tap, workdir
        self.firmware, self.mac, self.accel, self.memory_mb = firmware, mac, accel, memory_mb
        # With a QMP socket the VM is powered by whoever speaks QMP (the qemu_power plugin):
        # it starts off (-S), and a guest powering off stops it instead of ending QEMU.
        self.qmp = qmp
        workdir.mkdir(parents=True, exist_ok=True)
        self.serial = workdir / "serial.log"
        self.stderr = workdir / "qemu.stderr"
        self.vars_copy = workdir / "OVMF_VARS.fd"  # UEFI: a fresh variable store per boot
        self.proc: subprocess.Popen | None = None
        self.console = Console(self.serial, 0.0)
        self.powered_on_wall = 0.0  # time.time() at start, to compare with server timestamps
        self.exited_at: float | None = None  # seconds since power-on, once QEMU has exited

    def argv(self) -> list[str]:
        argv = [QEMU, "-accel", self.accel, "-m", str(self.memory_mb), "-nographic",
                "-no-reboot", "-netdev", f"tap,id=n0,ifname={self.tap},script=no,downscript=no"]  # fmt: skip
        if self.qmp is not None:
            # No -no-reboot: with it QEMU turns a QMP system_reset into a shutdown too, and
            # a power cycle would leave the VM off. A guest reboot then netboots again.
            argv.remove("-no-reboot")
            argv += ["-S", "-no-shutdown", "-qmp", f"unix:{self.qmp},server=on,wait=off"]
        if self.firmware == "bios":
            return argv + ["-boot", "n", "-device", f"virtio-net-pci,netdev=n0,mac={self.mac}"]
        return argv + [
            "-machine", "q35",
            "-drive", f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
            "-drive", f"if=pflash,format=raw,file={self.vars_copy}",
            # No option ROM: OVMF's own virtio-net driver and HTTP boot client.
            "-device", f"virtio-net-pci,netdev=n0,mac={self.mac},bootindex=1,romfile=",
            # No PXE boot options at all: HTTPv4 comes first (each PXE option waits ~64 s).
            "-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n",
            "-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n",
            # No IPv6 in the firmware: no HTTPv6 option after an HTTPv4 failure either.
            "-fw_cfg", "name=opt/org.tianocore/IPv6Support,string=n",
        ]  # fmt: skip

    def start(self) -> Vm:
        if self.firmware == "uefi":  # OVMF writes the boot options it creates there
            shutil.copyfile(OVMF_VARS, self.vars_copy)
        argv = self.argv()
        (self.workdir / "cmdline.txt").write_text(" ".join(argv) + "\n")
        with self.serial.open("wb") as out, self.stderr.open("wb") as err:
            self.powered_on_wall = time.time()
            self.console.t0 = time.monotonic()
            self.proc = self.host.popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        return self

    def wait_for(self, pattern: str, timeout: float) -> tuple[float, str]:
        """The first console line matching ``pattern``: (seconds since power-on, line).
        Fails at once when QEMU has exited without printing it."""
        deadline = time.monotonic() + timeout
        while True:
            self.console.poll()
            found = self.console.find(pattern)
            if found:
                return found
            if self._started().poll() is not None:
                self.console.poll()
                if found := self.console.find(pattern):
                    return found
                raise VmExited(f"VM exited {self._started().returncode} before /{pattern}/\n"
                               f"{self.console.text()}\n{self.stderr_text()}")  # fmt: skip
            if time.monotonic() > deadline:
                raise Timeout(f"/{pattern}/ not on the VM console within {timeout} s\n"
                              f"{self.console.text()}")  # fmt: skip
            time.sleep(POLL)

    def wait_exit(self, timeout: float) -> float:
        """Wait for QEMU to exit on its own (the guest powered off): seconds since power-on."""
        try:
            self._started().wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Timeout(f"VM still running {timeout} s after the request\n"
                          f"{self.console.text()}") from None  # fmt: skip
        self.console.poll()
        self.exited_at = time.monotonic() - self.console.t0
        return self.exited_at

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=5.0)

    def _started(self) -> subprocess.Popen:
        if self.proc is None:
            raise LabError(f"VM {self.mac}: not started")
        return self.proc

    def stderr_text(self) -> str:
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""
