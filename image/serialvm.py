"""The appliance image booted in QEMU, driven on its serial console (pexpect), as an
operator at the serial port drives it: the setup dialog answered, root logged in, shell
commands run. Used by image.check and image.e2e; every wait has a deadline.

The VM writes to a QEMU snapshot of the disk image (kept across the guest's reboots,
never written back), so one built image serves any number of runs.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pexpect

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
PASSWORD = "rackboot"  # image.build --root-password, for the test builds
PROMPT = "root@rackboot:~# "
BOOT = 600  # seconds a boot may take under TCG


class Vm:
    """``qemu-system-x86_64`` on ``disk`` with its serial console on pexpect. ``nics``:
    QEMU ``-netdev`` specifications, each given a virtio NIC with the MAC beside it;
    ``wrapper``: what runs QEMU (``ip netns exec NS``)."""

    def __init__(self, disk: Path, work: Path, *, firmware: str, accel: str,
                 nics: list[tuple[str, str]], wrapper: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.work = work
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        argv = [*wrapper, "qemu-system-x86_64", "-accel", accel, "-m", "2048", "-smp", "2",
                "-display", "none", "-serial", "stdio", "-monitor", "none",
                # snapshot: writes stay in QEMU (across the guest's reboots), not the image
                "-drive", f"file={disk},format=raw,if=virtio,snapshot=on"]  # fmt: skip
        for i, (netdev, mac) in enumerate(nics):
            argv += ["-netdev", f"{netdev},id=n{i}",
                     "-device", f"virtio-net-pci,netdev=n{i},mac={mac}"]  # fmt: skip
        if firmware == "uefi":
            shutil.copyfile(OVMF_VARS, work / "vars.fd")
            argv += ["-drive", f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
                     "-drive", f"if=pflash,format=raw,file={work / 'vars.fd'}"]  # fmt: skip
        (work / "cmdline.txt").write_text(" ".join(argv) + "\n")
        self.console = open(work / "console.log", "w", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed by stop)
        self.started = time.monotonic()
        self.child = pexpect.spawn(argv[0], argv[1:], encoding="utf-8", codec_errors="replace",
                                   timeout=BOOT, logfile=self.console)  # fmt: skip

    def since_start(self) -> float:
        return time.monotonic() - self.started

    def expect(self, pattern: str, timeout: float = BOOT) -> str:
        self.child.expect(pattern, timeout=timeout)
        return self.child.match.group(0) if hasattr(self.child.match, "group") else ""

    def answer(self, prompt: str, text: str) -> None:
        self.child.expect_exact(prompt, timeout=BOOT)
        self.child.sendline(text)

    def shell(self, command: str, timeout: float = 120) -> str:
        """Run ``command`` at the root prompt; what it printed (the echo included)."""
        self.child.sendline(command)
        self.child.expect_exact(PROMPT, timeout=timeout)
        return self.child.before

    def output(self, command: str, timeout: float = 120) -> str:
        """What ``command`` printed, without the echo and the prompt's noise: the lines
        between two markers the shell prints around it."""
        text = self.shell(f"echo '<<'OUT; {command}; echo OUT'>>'", timeout)
        found = re.search(r"<<OUT\r*\n(.*?)OUT>>", text, re.S)
        return found.group(1).replace("\r", "") if found else ""

    def login(self) -> None:
        """Root on the console. A prompt already on the screen may belong to a system
        that is going down (a verdict's reboot): ask again until one answers."""
        deadline = time.monotonic() + BOOT
        while time.monotonic() < deadline:
            self.child.sendline("")
            try:
                self.child.expect_exact("rackboot login: ", timeout=30)
                self.child.sendline("root")
                self.child.expect_exact("Password: ", timeout=30)
                self.child.sendline(PASSWORD)
                self.child.expect_exact(PROMPT, timeout=60)
                return
            except pexpect.TIMEOUT:
                continue
        raise TimeoutError("no login on the serial console")

    def stop(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
        self.console.close()


@dataclass(frozen=True)
class Setup:
    """The dialog's answers (docs/setup.md); interfaces are named by their MAC, which
    the dialog lists beside each name."""

    management_mac: str
    management: str  # address/prefix
    gateway: str
    provisioning_mac: str
    subnet: str
    address: str
    pool: str
    name: str = "rb-demo"
    rack: str = "r1"


def interface_names(listing: str) -> dict[str, str]:
    """MAC -> interface name, from the dialog's interface list."""
    return {mac: name for name, mac in re.findall(r"^\s*(\S+)\s+\S+\s+([0-9a-f:]{17})\s*$",
                                                  listing.replace("\r", ""), re.M)}  # fmt: skip


def wait_for_dialog(vm: Vm) -> dict[str, str]:
    """The first-boot dialog's first question; the interface names it listed, by MAC."""
    vm.expect(r"Name of this appliance \[")
    return interface_names(vm.child.before)


def setup_dialog(vm: Vm, setup: Setup, names: dict[str, str]) -> None:
    """Answer the dialog (its first question on the screen) as ``setup`` says, with a
    new cluster, no router and no VIP, and confirm."""
    management, provisioning = names[setup.management_mac], names[setup.provisioning_mac]
    vm.child.sendline(setup.name)
    vm.answer("Rack it serves: ", setup.rack)
    vm.answer("Management interface: ", management)
    vm.answer("Management address/prefix (other appliances reach this one here): ",
              setup.management)  # fmt: skip
    vm.answer("Management gateway ('none') [none]: ", setup.gateway)
    vm.answer("Provisioning interface(s), comma-separated: ", provisioning)
    vm.answer(f"Subnet on {provisioning} (CIDR): ", setup.subnet)
    vm.expect(rf"This appliance's address on {provisioning}( \[[0-9.]+\])?: ")
    vm.child.sendline(setup.address)
    vm.answer(f"DHCP pool(s) in {setup.subnet}, 'first-last': ", setup.pool)
    vm.answer(f"Router for machines on {setup.subnet} ('none') [none]: ", "none")
    vm.answer("The rack's virtual IP (held by the active appliance; 'none'): ", "none")
    vm.answer("Cluster: 'new' to create one, 'join' to paste a join token [new]: ", "new")
    vm.answer("Write it to /etc/rackboot/rackboot.toml? [y/n]: ", "y")
