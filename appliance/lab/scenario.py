"""The virtual rack ``rackboot lab`` builds and what happens to it: two appliances and a
witness (real ``rackboot run`` and ``rackboot witness`` processes, appliance/lab/rack.py)
on a bridge in network namespaces, a QEMU VM on the same link powered through its QMP
socket by the ``qemu_power`` plugin; the active provisions the VM, is killed with
SIGKILL, and the standby, now active, provisions it again.

The VM boots the fastest path: QEMU's own iPXE ROM (BIOS) asks DHCP, which answers an
iPXE client with the HTTP script of the boot table's default (``ipxe_script``, on the
rack's VIP), then Debian's cloud kernel and a small installer that posts ``installed``
(appliance/lab/initrd.py). Everything the lab shows comes from the appliances' control
sockets; the timings from the rack's own records.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance import control
from appliance.errors import RackbootError
from appliance.lab import census, debs, initrd, leftovers, view, vm
from appliance.lab.boot import boot_sections
from appliance.lab.netns import Lab, LabError, delete_netns
from appliance.lab.processes import POLL, Timeout
from appliance.lab.rack import Rack
from appliance.lab.screen import Screen

MACHINE = "vm1"
MAC = "52:54:00:6c:61:62"
INSTALLED = f"{initrd.MARK} installed"
FAILED = f"{initrd.MARK} FAILED"
SETTLE_TIMEOUT = 20.0  # the standby following every record, before the kill
FAILOVER_TIMEOUT = 15.0  # the kill to the standby active (about a second measured)
REFRESH = 0.5  # seconds between two looks at the status (the block on screen)
STATUS_TIMEOUT = 1.0  # one control-socket call


@dataclass(frozen=True)
class Settings:
    workdir: Path
    cache: Path  # the VM's kernel and busybox (debs.py), reused across runs
    accel: str  # "tcg" | "kvm"
    boot_timeout: float


@dataclass(frozen=True)
class Boot:
    served_by: str
    stages: list[tuple[str, float]]  # seconds since the power-on request

    @property
    def seconds(self) -> float:
        return dict(self.stages).get("provisioned", float("nan"))


@dataclass(frozen=True)
class Failover:
    killed: str
    active: str
    gap: float  # SIGKILL to the lease held by the other, by the rack's clock
    epoch: int


class VirtualRack:
    """Built by :meth:`build`, brought up by :meth:`start`; :meth:`close` always."""

    def __init__(self, lab_id: str, settings: Settings, screen: Screen) -> None:
        self.lab_id = lab_id
        self.settings = settings
        self.screen = screen
        self.lab: Lab | None = None
        self.rack: Rack | None = None
        self.machine: vm.Vm | None = None
        self.killed: set[str] = set()
        self.phase = "building"

    # -- building ---------------------------------------------------------------

    def build(self) -> None:
        work = self.settings.workdir
        http, tftp, sockets = work / "boot" / "http", work / "boot" / "tftp", work / "qmp"
        for directory in (http, tftp, sockets):
            directory.mkdir(parents=True, exist_ok=True)
        self.screen.say(f"the VM's kernel and busybox: Debian packages, fetched once with "
                        f"apt-get download into {self.settings.cache}")  # fmt: skip
        kernel = debs.kernel(self.settings.cache)
        shutil.copyfile(kernel.image, http / "vmlinuz")
        initrd.build(kernel, debs.busybox(self.settings.cache), http / "initrd.img")
        accel, why = vm.accelerator(self.settings.accel)
        self.screen.say(f"kernel {kernel.version}, installer initrd built; QEMU accelerator "
                        f"{accel}: {why}")  # fmt: skip
        self.lab = Lab(prefix=census.PREFIX, lab_id=self.lab_id)
        self.rack = Rack(
            self.lab, work / "rack", disabled=(), dhcp=rack_settings(http, tftp, sockets)
        )
        host, tap = vm.vm_host(self.lab)
        self.machine = vm.Vm(host, tap, work / "vm", firmware="bios", mac=MAC, accel=accel,
                             qmp=sockets / f"{MACHINE}.qmp")  # fmt: skip
        self.screen.say(f"namespaces {', '.join(self.lab.namespaces)} on bridge "
                        f"{self.lab.bridge}, network {self.lab.network}, VIP {self.rack.vip}")  # fmt: skip

    def start(self) -> None:
        rack, machine = self._rack(), self._machine()
        self.phase = "starting"
        rack.start()
        self.screen.say(f"rack up: {', '.join(rack.actives())} active, the standby follows")
        machine.start()
        qmp = self.settings.workdir / "qmp" / f"{MACHINE}.qmp"
        self.watch(lambda: qmp.exists() and self.record() is not None, 30,
                   "the VM's QMP socket and its record on the active")  # fmt: skip
        self.screen.say(f"VM {MACHINE} ({MAC}) created, powered off, "
                        f"known to the rack as machine {MACHINE}")  # fmt: skip

    # -- what happens -------------------------------------------------------------

    def boot(self, label: str) -> Boot:
        """The active provisions the VM: it powers it on (or cycles it) and follows its
        stages to the installer's ``installed``."""
        active = self.active()
        installed_before = self._console_count(INSTALLED)
        self.phase = label
        requested = time.time()
        self._rack().nodes[active].call("machines.reprovision", {"name": MACHINE})
        self.screen.say(f"{label}: {active} (active) provisions {MACHINE}: power on, DHCP, "
                        "iPXE, HTTP script, kernel, installer")  # fmt: skip

        def installed() -> bool:
            self._fail_on_console()
            record = self.record() or {}
            if record.get("state") == "failed":
                raise LabError(f"{label}: the rack marked {MACHINE} failed: "
                               f"{record.get('history', [])[-3:]}")  # fmt: skip
            done = record.get("state") == "provisioned" and record["since"] >= requested
            return done and self._console_count(INSTALLED) > installed_before

        self.watch(installed, self.settings.boot_timeout, f"{label}: {MACHINE} installed")
        stages = view.stage_times((self.record() or {}).get("history", []), requested)
        boot = Boot(active, stages)
        self.screen.say(f"{label}: installed {boot.seconds:.1f} s after the request, served "
                        f"by {active} ({view.timings_text(stages)})")  # fmt: skip
        return boot

    def fail_over(self) -> Failover:
        rack = self._rack()
        self.phase = "failover"
        self.watch(rack.settled, SETTLE_TIMEOUT, "the standby following every record")
        old = self.active()
        (new,) = [name for name in rack.nodes if name != old and name not in self.killed]
        killed_at = time.time()
        rack.nodes[old].kill9()
        self.killed.add(old)
        self.screen.say(f"killed the active {old} (SIGKILL, pid {rack.nodes[old].pids[-1]})")
        self.watch(lambda: rack.nodes[new].active(), FAILOVER_TIMEOUT, f"{new} taking over")
        ha = rack.nodes[new].ha() or {}
        gap = float(ha.get("changed_at", {}).get("acquired", time.time())) - killed_at
        self.watch(lambda: rack.has_vip(new), 5, f"the VIP on {new}")
        done = Failover(old, new, gap, int(ha.get("epoch") or 0))
        self.screen.say(f"failover: {new} active {gap:.2f} s after the kill, epoch "
                        f"{done.epoch}, the VIP {rack.vip} moved to it")  # fmt: skip
        return done

    def rejoin(self, name: str) -> None:
        """Start a killed appliance again: it comes back as the standby and catches up."""
        rack = self._rack()
        self.phase = f"{name} rejoining"
        rack.nodes[name].start(timeout=60)
        self.killed.discard(name)
        self.watch(rack.settled, SETTLE_TIMEOUT, f"{name} following the active again")
        self.screen.say(f"{name} restarted: standby, following every record")

    def hints(self) -> list[str]:
        """Commands to look at the running rack from another terminal."""
        rack = self._rack()
        cli = Path(sys.executable).with_name("rackboot")
        command = str(cli) if cli.exists() else f"{sys.executable} -m appliance"
        sockets = {name: node.socket for name, node in rack.nodes.items()}
        some = next(iter(sockets.values()))
        return [
            *(f"{command} ha status --socket {path}" for path in sockets.values()),
            f"{command} machines show {MACHINE} --socket {some}",
            f"{command} leases list --socket {some}",
            f"ip netns exec {rack.client.ns} udhcpc -i {rack.client.ifname} -f -q  "
            "(a DHCP client on the rack's link)",
        ]

    # -- looking --------------------------------------------------------------------

    def watch(self, until: Callable[[], Any] | None, timeout: float | None, what: str) -> None:
        """Show the status every REFRESH s until ``until()`` holds (checked every POLL s);
        :class:`Timeout` after ``timeout`` s. ``until=None``: until interrupted."""
        start = time.monotonic()
        shown = -REFRESH
        while True:
            now = time.monotonic()
            if now - shown >= REFRESH:
                self.refresh()
                shown = now
            if until is not None and until():
                self.refresh()
                return
            if timeout is not None and now - start > timeout:
                raise Timeout(f"{what}: not within {timeout:g} s (logs under "
                              f"{self.settings.workdir})")  # fmt: skip
            time.sleep(POLL)

    def refresh(self) -> None:
        rack = self._rack()
        appliances = [self._appliance(name) for name in rack.nodes]
        names = {node_id: name for name, node_id in rack.ids.items()}
        lines = [view.appliance_line(one, names) for one in appliances]
        witness = view.witness_line("w", rack.ids["w"], appliances)
        record = self.record()
        machine = view.machine_line(MACHINE, record, time.time())
        header = f"rack {census.PREFIX}{self.lab_id} ({self.phase})"
        key = (self.phase, *map(view.appliance_key, appliances), (record or {}).get("state"))
        self.screen.show(view.status_block(header, [*lines, witness, machine]), key)

    def record(self) -> dict[str, Any] | None:
        """The VM's record, from the active (else any appliance that answers)."""
        rack = self._rack()
        order = sorted(rack.nodes, key=lambda name: name != self._seen_active())
        for name in order:
            if name in self.killed:
                continue
            try:
                return control.call(rack.nodes[name].socket, "machines.show",
                                    {"name": MACHINE}, timeout=STATUS_TIMEOUT)  # fmt: skip
            except RackbootError:
                continue
        return None

    def active(self) -> str:
        rack = self._rack()
        self.watch(lambda: len(rack.actives()) == 1, FAILOVER_TIMEOUT, "one active appliance")
        return rack.actives()[0]

    def _seen_active(self) -> str:
        actives = self._rack().actives()
        return actives[0] if len(actives) == 1 else ""

    def _appliance(self, name: str) -> view.Appliance:
        if name in self.killed:
            return view.Appliance(name, None, "killed (SIGKILL)")
        try:
            status = control.call(self._rack().nodes[name].socket, "status",
                                  timeout=STATUS_TIMEOUT)  # fmt: skip
        except RackbootError:
            return view.Appliance(name, None, "not answering")
        return view.Appliance(name, status)

    def _console_count(self, marker: str) -> int:
        console = self._machine().console
        console.poll()
        return sum(1 for _, line in console.lines if marker in line)

    def _fail_on_console(self) -> None:
        machine = self._machine()
        machine.console.poll()
        failed = machine.console.find(FAILED)
        if failed:
            raise LabError(f"the VM's installer failed: {failed[1]} (console: {machine.serial})")
        if machine.proc is not None and machine.proc.poll() is not None:
            raise LabError(f"QEMU exited {machine.proc.returncode}: {machine.stderr_text()[-500:]}")

    def _rack(self) -> Rack:
        if self.rack is None:
            raise LabError("the rack is not built")
        return self.rack

    def _machine(self) -> vm.Vm:
        if self.machine is None:
            raise LabError("the VM is not built")
        return self.machine

    # -- teardown -----------------------------------------------------------------

    def close(self) -> list[str]:
        """Stop everything by PID, remove every namespace; what could not be, as text."""
        problems: list[str] = []
        for step in (self._stop_machine, self._stop_rack, self._stop_stragglers, self._drop_lab):
            try:
                step()
            except (OSError, RackbootError) as exc:
                problems.append(f"{step.__name__.strip('_').replace('_', ' ')}: {exc}")
        left = census.by_lab(leftovers.namespaces()).get(self.lab_id, [])
        if left:
            problems.append(f"namespaces left: {', '.join(left)}")
        return problems

    def _stop_machine(self) -> None:
        if self.machine is not None:
            self.machine.stop()

    def _stop_rack(self) -> None:
        if self.rack is not None:
            self.rack.close()

    def _stop_stragglers(self) -> None:
        # Processes our processes started (the VIP guard), in our namespaces only.
        for ns in self._namespaces():
            leftovers.end_processes_in(ns)

    def _drop_lab(self) -> None:
        if self.lab is not None:
            self.lab.close()
        for ns in self._namespaces():  # made before the lab object knew (an interrupt)
            delete_netns(ns)

    def _namespaces(self) -> list[str]:
        """Ours: those the lab object recorded and any other carrying our id."""
        found = census.by_lab(leftovers.namespaces()).get(self.lab_id, [])
        return sorted({*found, *(self.lab.namespaces if self.lab else ())})


def rack_settings(http: Path, tftp: Path, sockets: Path) -> str:
    """What the appliances add to the rack's DHCP and HA configuration (rack.py): HTTP
    boot's files and profile, the machine and how it is powered. DHCP's boot table is
    left at its defaults: an iPXE client gets the HTTP script straight away."""
    machine = f"""
    [[provisioning.machines]]
    name = "{MACHINE}"
    macs = ["{MAC}"]
    power = "qemu:{MACHINE}"
    [qemu_power]
    sockets = "{sockets}"
    """
    return "\n" + boot_sections(str(http), str(tftp)) + textwrap.dedent(machine)
