"""VMs on one side's link: one namespace with a bridge, one tap per VM, QEMU per VM.

:func:`appliance.lab.vm.vm_host` makes the namespace and its first tap
(it names its host ``vm`` and its tap after the lab: one VM per lab); the scale
scenario's other VMs get more taps on the same bridge here (:func:`add_taps`).
"""

from __future__ import annotations

import time
from pathlib import Path

from appliance.lab import vm
from bench.netboot.timings import MARK, BootRecord, dhcp_acks, dhcp_reply_ms
from tests.support.netns import Host, Lab, LabError

OFF_TIMEOUT = 30.0  # the installer's last word to QEMU's exit
# The firmware gave up on the network (SeaBIOS; OVMF): no need to wait for the timeout.
NOTHING_TO_BOOT = r"No bootable device|No more network devices|BdsDxe: No bootable option|Shell>"
POLL = 0.02  # seconds between looks at the consoles (vm.Console stamps lines when read)


class VmLink:
    """The VM namespace of one lab and its taps, created as more VMs are needed."""

    def __init__(self, lab: Lab) -> None:
        self.host, first = vm.vm_host(lab)
        self.taps: list[str] = [first]
        self.lab = lab

    def taps_for(self, count: int) -> list[str]:
        add_taps(self.host, self.lab.id, self.taps, count)
        return self.taps[:count]


def add_taps(host: Host, lab_id: str, taps: list[str], count: int) -> None:
    """Grow ``taps`` to ``count`` taps on ``host``'s bridge ``brvm`` (made by vm_host)."""
    while len(taps) < count:
        tap = f"t{len(taps)}-{lab_id}"
        for args in (["tuntap", "add", "dev", tap, "mode", "tap"],
                     ["link", "set", tap, "master", "brvm", "up"]):  # fmt: skip
            res = host.run(["ip", *args], timeout=10)
            if res.returncode != 0:
                raise LabError(f"ip {' '.join(args)} in {host.ns}: {res.stderr.strip()}")
        taps.append(tap)


def mac_of(index: int) -> str:
    """A distinct MAC per boot of the run: every boot is a machine neither server knows."""
    if not 0 <= index < 1 << 16:
        raise ValueError(f"boot index out of range: {index}")
    return f"52:54:00:6e:{index >> 8:02x}:{index & 0xFF:02x}"


def boot(side, link: VmLink, work: Path, firmware: str, macs: list[str], accel: str,
         timeout: float) -> tuple[list[BootRecord], float]:  # fmt: skip
    """Power on one VM per MAC at once on ``side``'s link, wait until every installer
    has said its last word (or ``timeout``), then for QEMU to exit: the records, and
    the CPU seconds the server used meanwhile."""
    side.prepare(macs)
    machines = [vm.Vm(link.host, tap, work / f"vm-{mac.replace(':', '')}", firmware=firmware,
                      mac=mac, accel=accel)
                for tap, mac in zip(link.taps_for(len(macs)), macs, strict=True)]  # fmt: skip
    cpu_before = side.cpu_seconds()
    try:
        for machine in machines:
            machine.start()
        for machine in _wait_all(machines, timeout):
            machine.wait_exit(OFF_TIMEOUT)
    finally:
        for machine in machines:
            machine.stop()
    time.sleep(0.2)  # the last access line and sniffed frame reach their files
    server_cpu = round(side.cpu_seconds() - cpu_before, 3)
    frames, access = side.sniffer.frames(), side.access()
    records = []
    for machine in machines:
        machine.console.poll()
        ack, addresses = dhcp_acks(frames, machine.mac)
        records.append(BootRecord(machine.mac, machine.powered_on_wall,
                                  list(machine.console.lines), ack, addresses, access,
                                  dhcp_reply_ms(frames, machine.mac)))  # fmt: skip
    return records, server_cpu


def _wait_all(machines: list[vm.Vm], timeout: float) -> list[vm.Vm]:
    """Until every console shows the installer's last word, or the firmware's own
    "nothing to boot", or its QEMU has exited, or ``timeout``: the VMs whose
    installer spoke (the others are recorded as failed boots, not waited for)."""
    deadline = time.monotonic() + timeout
    pending, spoke = list(machines), []
    while pending and time.monotonic() < deadline:
        for machine in list(pending):
            machine.console.poll()
            assert machine.proc is not None
            if machine.console.find(f"{MARK} (installed|FAILED)"):
                spoke.append(machine)
            elif not (machine.console.find(NOTHING_TO_BOOT) or machine.proc.poll() is not None):
                continue
            pending.remove(machine)
        time.sleep(POLL)
    return spoke
