"""The provisioning workflow with real QEMU VMs in namespaces the test creates.

A Rackboot node (DHCP, TFTP, HTTP boot, RA, provisioning, qemu_power) and four VMs
that start powered off (``-S``) with QMP sockets the ``qemu_power`` plugin speaks
to: ``web1``'s installer reports a failure, ``web2``'s starts and then hangs (both
by MAC, on the kernel command line: appliance/lab/initrd.py), the spares
install. Requesting web1 and web2 is all the test does: the workflow powers them
on, sees every stage from the servers (DHCP lease, TFTP/HTTP loader, kernel and
initrd over HTTP, the installer's events), retries each once after its failure or
its timeout, then marks it failed, powers it off and gives its profile to a spare,
which provisions. The records' histories and the metrics say so.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from appliance.lab import vm
from appliance.lab.boot import CMDLINE, TFTP_SCRIPT, boot_sections
from tests.real.test_netboot import installer  # noqa: F401 (the fixture)
from tests.support.ha_lab import Rack
from tests.support.netboot.node import NetbootNode
from tests.support.netns import Lab

MACS = {"web1": "52:54:00:70:00:01", "web2": "52:54:00:70:00:02",
        "spare1": "52:54:00:70:00:03", "spare2": "52:54:00:70:00:04"}  # fmt: skip
INSTALLING_TIMEOUT = 15.0  # web2's installer: started, then silent
WORKFLOW_TIMEOUT = 400.0  # four TCG VMs on two vCPUs: ~70 s measured


def _machines(names: dict[str, str], sockets: Path) -> str:
    rows = []
    for name, mac in names.items():
        spare = name.startswith("spare")
        rows.append(f"""
            [[provisioning.machines]]
            name = "{name}"
            macs = ["{mac}"]
            pool = "rack1"
            spare = {str(spare).lower()}
            power = "qemu:{name}"
            """)  # fmt: skip
    return "".join(rows) + f"""
            [qemu_power]
            sockets = "{sockets}"
            """  # fmt: skip


def test_a_failing_and_a_hanging_machine_are_retried_then_replaced_by_spares(
    lab: Lab,
    tmp_path: Path,
    installer,  # noqa: F811
) -> None:
    srv = lab.add_host("srv")
    http_root, tftp_root, sockets = tmp_path / "http", tmp_path / "tftp", tmp_path / "qmp"
    for d in (http_root, tftp_root, sockets):
        d.mkdir()
    shutil.copyfile(installer.kernel, http_root / "vmlinuz")
    shutil.copyfile(installer.initrd, http_root / "initrd.img")
    (tftp_root / "boot.ipxe").write_text(TFTP_SCRIPT)
    faults = f"rackboot.test.fail={MACS['web1']} rackboot.test.hang={MACS['web2']}"
    net = lab.network.network_address
    node = NetbootNode(srv, tmp_path / "node", f"""
        [[dhcp.subnets]]
        network = "{lab.network}"
        pools = ["{net + 100}-{net + 150}"]
        [dhcp.boot]
        ipxe_script = "boot.ipxe"
        {boot_sections(str(http_root), str(tftp_root), address=srv.addr,
                       cmdline=f"{CMDLINE} {faults}")}
        [provisioning]
        retries = 1
        [provisioning.timeouts]
        requested = 120.0
        discovered = 120.0
        loader = 120.0
        kernel = 120.0
        installing = {INSTALLING_TIMEOUT}
        {_machines(MACS, sockets)}
        """, ready=("tftp", "httpboot")).start()  # fmt: skip
    host, taps = vm.vms_host(lab, len(MACS))
    vms = {
        name: vm.Vm(
            host,
            tap,
            tmp_path / name,
            firmware="bios",
            mac=mac,
            accel=installer.accel,
            qmp=sockets / f"{name}.qmp",
        ).start()  # fmt: skip
        for (name, mac), tap in zip(MACS.items(), taps, strict=True)
    }
    try:
        _wait(lambda: all((sockets / f"{n}.qmp").exists() for n in vms), 20, "QMP sockets")
        _wait(lambda: len(node.call("machines.list")) == 4, 20, "the inventory in the state")
        started = time.monotonic()
        for name in ("web1", "web2"):
            assert node.call("machines.reprovision", {"name": name})["state"] == "requested"

        def settled() -> bool:
            states = {m["name"]: m["state"] for m in node.call("machines.list")}
            return states == {"web1": "failed", "web2": "failed",
                              "spare1": "provisioned", "spare2": "provisioned"}  # fmt: skip

        _wait(settled, WORKFLOW_TIMEOUT, "both replaced by provisioned spares",
              detail=lambda: _explain(node, vms))  # fmt: skip
        print(f"provisioning VMs: settled in {time.monotonic() - started:.1f} s")

        web1, web2 = (node.call("machines.show", {"name": n}) for n in ("web1", "web2"))
        whys = [why for _, _, why in web1["history"]]
        assert any(w.startswith("retry 1: installer failed: no disk") for w in whys), whys
        assert web1["deprovision"] and web2["deprovision"]
        whys = [why for _, _, why in web2["history"]]
        assert any(w.startswith("retry 1: no progress past installing") for w in whys), whys
        # Every stage was seen from the servers, not skipped: the spare's own history.
        spares = [node.call("machines.show", {"name": n}) for n in ("spare1", "spare2")]
        assert {s["replaces"] for s in spares} == {"web1", "web2"}
        for spare in spares:
            stages = [state for _, state, _ in spare["history"]]
            assert stages[-5:] == ["requested", "discovered", "loader", "kernel", "provisioned"]
        metrics = node.metrics()
        failures = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                    for line in metrics.splitlines()
                    if line.startswith("rackboot_provisioning_failures_total{")}  # fmt: skip
        # web1's installer failed from the kernel stage, twice; web2 went silent installing.
        assert failures == {
            'rackboot_provisioning_failures_total{reason="installer",stage="kernel"}': 2.0,
            'rackboot_provisioning_failures_total{reason="timeout",stage="installing"}': 2.0,
        }, failures
        assert "rackboot_provisioning_spares_used_total 2.0" in metrics
    finally:
        for one in vms.values():
            one.stop()
        node.stop()


def _wait(predicate, timeout: float, what: str, detail=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s\n{detail()}")
        time.sleep(0.5)


def _explain(node: NetbootNode, vms: dict[str, vm.Vm]) -> str:
    lines = []
    for m in node.call("machines.list"):
        record = node.call("machines.show", {"name": m["name"]})
        lines.append(f"{m['name']}: {m['state']} {record['history'][-4:]}")
    for name, one in vms.items():
        one.console.poll()
        lines.append(f"--- {name} console (tail)\n{one.console.text()[-1500:]}")
    return "\n".join(lines)


def test_the_standby_completes_a_provisioning_when_the_active_dies_mid_way(
    lab: Lab,
    tmp_path: Path,
    installer,  # noqa: F811
) -> None:
    """Two appliances and a witness (tests/support/ha_lab.py) serve the rack from its VIP;
    the active is killed with SIGKILL once the VM fetched its kernel and initrd. The new
    active reloads the record, deadline included, and takes the installer's event (or,
    had the VM's requests died with the old active, cycles it at the deadline): the
    machine ends provisioned, by the appliance that was the standby."""
    http_root, tftp_root, sockets = tmp_path / "http", tmp_path / "tftp", tmp_path / "qmp"
    for d in (http_root, tftp_root, sockets):
        d.mkdir()
    shutil.copyfile(installer.kernel, http_root / "vmlinuz")
    shutil.copyfile(installer.initrd, http_root / "initrd.img")
    (tftp_root / "boot.ipxe").write_text(TFTP_SCRIPT)
    mac = MACS["spare1"]  # a machine whose installer works
    rack = Rack(lab, tmp_path / "rack", disabled=(), dhcp=f"""
        [dhcp.boot]
        ipxe_script = "boot.ipxe"
        {boot_sections(str(http_root), str(tftp_root))}
        [provisioning]
        retries = 2
        [provisioning.timeouts]
        kernel = 60.0
        [[provisioning.machines]]
        name = "web9"
        macs = ["{mac}"]
        power = "qemu:web9"
        [qemu_power]
        sockets = "{sockets}"
        """)  # fmt: skip
    host, tap = vm.vm_host(lab)
    machine = vm.Vm(host, tap, tmp_path / "web9", firmware="bios", mac=mac,
                    accel=installer.accel, qmp=sockets / "web9.qmp")  # fmt: skip
    try:
        rack.start()
        machine.start()
        (active,) = rack.actives()
        standby = next(n for n in rack.nodes if n != active)
        old, new = rack.nodes[active], rack.nodes[standby]
        _wait(lambda: (sockets / "web9.qmp").exists(), 20, "the QMP socket")
        _wait(lambda: any(m["name"] == "web9" for m in new.call("machines.list")), 20,
              "the record on the standby")  # fmt: skip

        def state(node) -> str:
            return node.call("machines.show", {"name": "web9"})["state"]

        assert old.call("machines.reprovision", {"name": "web9"})["state"] == "requested"
        _wait(lambda: state(new) in ("kernel", "installing", "provisioned"), 240,
              "the kernel fetched, as the standby follows it", detail=rack.logs)  # fmt: skip
        seen_by_standby = state(new)
        old.kill9()
        killed = time.monotonic()
        _wait(lambda: rack.actives() == [standby], 30, "the takeover", detail=rack.logs)
        _wait(lambda: state(new) == "provisioned", 240, "provisioned by the new active",
              detail=lambda: f"{new.call('machines.show', {'name': 'web9'})}\n"
              f"{machine.console.text()[-2000:]}\n{rack.logs()}")  # fmt: skip
        record = new.call("machines.show", {"name": "web9"})
        print(f"provisioning failover: the active killed at {seen_by_standby!r}; provisioned "
              f"{time.monotonic() - killed:.1f} s later, attempt {record['attempt']}, "
              f"history {[s for _, s, _ in record['history']]}")  # fmt: skip
        assert record["state"] == "provisioned" and not record["deprovision"]
    finally:
        machine.stop()
        rack.close()
