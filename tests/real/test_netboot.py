"""A real QEMU VM netboots from a Rackboot node alone, in namespaces the test creates.

BIOS: SeaBIOS runs the NIC's iPXE ROM (``ipxe-qemu``). Its DHCP request carries
user class ``iPXE``, so the boot table answers ``ipxe_script``, set here to the
TFTP file ``boot.ipxe``; that script chains to the machine's HTTP script
(``/boot/{mac}.ipxe``), which loads the kernel and initrd over HTTP. UEFI: OVMF
with its PXE options off goes straight to HTTP boot; DHCP answers vendor class
``HTTPClient`` with the default ``http_x64`` URL (``/boot/ipxe.efi``, Debian's
``ipxe.efi``); iPXE then asks DHCP again and gets the default ``ipxe_script``
(the same HTTP script, no TFTP). Either way the installer of
:mod:`appliance.lab.initrd` posts ``installed`` to the events API and
powers the VM off.

The test asserts on the VM's serial console, on Rackboot's lease and its
recorded events, and prints the timings. docs/netboot-test.md has the figures.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from appliance.lab import debs, initrd, vm
from appliance.lab.boot import TFTP_SCRIPT, boot_sections
from tests.support.dhcplab import Sniffer, bootp_fields
from tests.support.netboot.node import NetbootNode
from tests.support.netns import Host, Lab

BOOT_TIMEOUT = 300.0  # power-on to the installer's last word; 23-48 s measured under TCG
OFF_TIMEOUT = 30.0  # the installer's last word to QEMU's exit
IPXE_EFI = Path("/usr/lib/ipxe/ipxe.efi")
MACS = {"bios": "52:54:00:6e:62:01", "uefi": "52:54:00:6e:62:02"}
MARK = initrd.MARK
ACK = 5


@dataclass(frozen=True)
class Installer:
    kernel: Path
    initrd: Path
    accel: str
    accel_reason: str


@pytest.fixture(scope="module")
def installer(
    netns_available: None, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Installer:
    reason = vm.missing() or (None if IPXE_EFI.exists() else f"{IPXE_EFI} is missing (ipxe)")
    if reason:
        pytest.skip(reason)
    # The unpacked .debs are kept across runs in pytest's cache (when its plugin is on).
    cached = getattr(request.config, "cache", None)
    cache = cached.mkdir("rackboot-netboot") if cached else tmp_path_factory.mktemp("debs")
    kernel = debs.kernel(cache)
    image = initrd.build(
        kernel, debs.busybox(cache), tmp_path_factory.mktemp("installer") / "initrd.img"
    )
    return Installer(kernel.image, image, *vm.accelerator())


@dataclass
class Boot:
    srv: Host
    node: NetbootNode
    machine: vm.Vm
    frames: list[dict]
    mac: str

    def seen(self, pattern: str) -> float:
        found = self.machine.console.find(pattern)
        assert found, f"/{pattern}/ not on the console:\n{self.machine.console.text()}"
        return found[0]

    def machine_record(self) -> dict:
        url = f"http://{self.srv.addr}/api/v1/machines/{self.mac.replace(':', '-')}"
        res = self.srv.run(["curl", "-sS", "--fail", "--max-time", "10", url], timeout=20)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)


@pytest.fixture
def boot(lab: Lab, tmp_path: Path, installer: Installer) -> Iterator:
    started: list[Boot] = []

    def run(firmware: str, dhcp_boot: str = "") -> Boot:
        srv = lab.add_host("srv")
        http_root, tftp_root = tmp_path / "http", tmp_path / "tftp"
        http_root.mkdir()
        tftp_root.mkdir()
        shutil.copyfile(installer.kernel, http_root / "vmlinuz")
        shutil.copyfile(installer.initrd, http_root / "initrd.img")
        shutil.copyfile(IPXE_EFI, http_root / "ipxe.efi")
        (tftp_root / "boot.ipxe").write_text(TFTP_SCRIPT)
        net = lab.network.network_address
        node = NetbootNode(srv, tmp_path / "node", f"""
            [[dhcp.subnets]]
            network = "{lab.network}"
            pools = ["{net + 100}-{net + 150}"]
            {dhcp_boot}
            {boot_sections(str(http_root), str(tftp_root), address=srv.addr)}
            """, ready=("tftp", "httpboot")).start()  # fmt: skip
        sniff = Sniffer(srv, tmp_path)
        host, tap = vm.vm_host(lab)
        machine = vm.Vm(host, tap, tmp_path / "vm", firmware=firmware, mac=MACS[firmware],
                        accel=installer.accel)  # fmt: skip
        print(f"netboot {firmware}: accel {installer.accel} ({installer.accel_reason})")
        one = Boot(srv, node, machine.start(), [], MACS[firmware])
        started.append(one)
        try:
            machine.wait_for(f"{MARK} (installed|FAILED)", BOOT_TIMEOUT)
            machine.wait_exit(OFF_TIMEOUT)
        finally:
            one.frames = sniff.stop()
        return one

    yield run
    for one in started:
        one.machine.stop()
        one.node.stop()


def test_bios_vm_boots_dhcp_tftp_http_kernel_and_reports_installed(boot) -> None:
    one = boot("bios", '[dhcp.boot]\n            ipxe_script = "boot.ipxe"')
    srv, hyphens = one.srv.addr, one.mac.replace(":", "-")
    # The VM's own account: DHCP named boot.ipxe, TFTP served it, it chained to HTTP.
    script_tftp = one.seen(rf"tftp://{srv}/boot\.ipxe\.\.\. ok")
    one.seen(r"RACKBOOT-TEST boot\.ipxe over TFTP on pcbios")
    script_http = one.seen(rf"http://{srv}/boot/{hyphens}\.ipxe\.\.\. ok")
    _assert_installed(one, script_http)
    _report(one, "bios", [("TFTP script", script_tftp), ("HTTP script", script_http)])


def test_uefi_vm_http_boots_to_installed(boot) -> None:
    one = boot("uefi")  # the default boot table: http_x64 and ipxe_script are HTTP URLs
    srv, hyphens = one.srv.addr, one.mac.replace(":", "-")
    http_boot = one.seen(r"Start HTTP Boot over IPv4")
    one.seen(rf"URI: http://{srv}/boot/ipxe\.efi")
    assert not one.machine.console.find(r"Start PXE"), "OVMF tried PXE first"
    script_http = one.seen(rf"http://{srv}/boot/{hyphens}\.ipxe\.\.\. ok")
    _assert_installed(one, script_http)
    _report(one, "uefi", [("HTTP boot", http_boot), ("HTTP script", script_http)])


def _assert_installed(one: Boot, script_at: float) -> None:
    console = one.machine.console
    assert not console.find(f"{MARK} FAILED"), console.text()
    srv = one.srv.addr
    one.seen(rf"http://{srv}/boot/vmlinuz\.\.\..* ok")
    one.seen(rf"http://{srv}/boot/initrd\.img\.\.\..* ok")
    one.seen(f"{MARK} event posted to http://{srv}/api/v1/machines/")
    one.seen(f"{MARK} installed, powering off")
    assert one.machine.proc is not None and one.machine.proc.returncode == 0
    # Rackboot's side: the VM's lease, and the event recorded from that address.
    (lease,) = [x for x in one.node.leases() if x["mac"] == one.mac]
    record = one.machine_record()
    assert (record["mac"], record["stage"], record["status"]) == (one.mac, "installed", "ok")
    (event,) = record["events"]
    assert (event["stage"], event["status"], event["client"]) == (
        "installed",
        "ok",
        lease["address"],
    )
    assert event["message"] == initrd.Event().message
    assert one.machine.powered_on_wall + script_at < event["time"]


def _report(one: Boot, firmware: str, steps: list[tuple[str, float]]) -> None:
    """Print power-on -> first DHCPACK -> steps -> event recorded -> powered off (seconds)."""
    mac = bytes.fromhex(one.mac.replace(":", ""))
    acks = [f["t"] for f in one.frames
            if f["sport"] == 67 and bootp_fields(f["payload"])["type"] == ACK
            and bytes.fromhex(f["payload"])[28:34] == mac]  # fmt: skip
    assert acks, "no DHCPACK to the VM captured"
    t0 = one.machine.powered_on_wall
    event_time = one.machine_record()["events"][0]["time"]
    rows = [
        ("DHCPACK", acks[0] - t0),
        *steps,
        # iPXE finishes configuring only once IPv6 autoconfiguration gives up
        # (~16 s here: nothing on the lab link sends router advertisements).
        ("iPXE configured", one.seen(r"Configuring \(net0 .*\)\.* ok")),
        ("init", one.seen(f"{MARK} init started")),
        ("installed", event_time - t0),
        ("off", one.machine.exited_at),
    ]
    rows.sort(key=lambda row: row[1])
    print(f"netboot {firmware} ({one.machine.accel}): "
          + ", ".join(f"{name} {t:.1f} s" for name, t in rows))  # fmt: skip
