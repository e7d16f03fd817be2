"""The qemu_power plugin against a real QEMU: a VM started powered off (``-S``) is
powered on, off (stopped and reset), cycled and on again, each shown by QEMU's own
``query-status`` (a guest that powered itself off, state ``shutdown``, is the
netboot VMs' case: tests/real/test_provisioning_vms.py); a missing socket, an unsafe name and a socket that never answers fail within the
timeout. No root needed: QEMU runs without a network."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.power.qemu import QemuPowerPlugin
from plugins.provisioning.lifecycle import Record
from tests.support.plugins import configured

QEMU = shutil.which("qemu-system-x86_64")
pytestmark = pytest.mark.skipif(QEMU is None, reason="qemu-system-x86_64 is not installed")


def machine(power: str) -> Record:
    return Record("vm1", ("52:54:00:00:00:01",), "", power=power)


def query_status(path: Path) -> str:
    """QEMU's run state, asked over QMP independently of the plugin."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        stream = sock.makefile("rwb")
        json.loads(stream.readline())  # greeting
        for name in ("qmp_capabilities", "query-status"):
            stream.write(json.dumps({"execute": name}).encode() + b"\n")
            stream.flush()
            while "event" in (reply := json.loads(stream.readline())):
                pass
        return reply["return"]["status"]


@pytest.fixture
def vm(tmp_path: Path) -> Iterator[Path]:
    sockets = tmp_path / "vms"
    sockets.mkdir()
    qmp = sockets / "vm1.qmp"
    proc = subprocess.Popen(
        [QEMU, "-machine", "q35,accel=tcg", "-m", "64", "-S", "-no-shutdown", "-display", "none",
         "-nodefaults", "-qmp", f"unix:{qmp},server=on,wait=off"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not qmp.exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "QEMU made no QMP socket in 10 s"
            time.sleep(0.05)
        yield qmp
    finally:
        proc.kill()
        proc.wait(timeout=10)


def plugin_for(tmp_path: Path, sockets: Path, timeout: float = 5.0) -> QemuPowerPlugin:
    plugin = QemuPowerPlugin()
    configured(tmp_path, {"qemu_power": {"sockets": str(sockets), "timeout": timeout}},
               qemu_power=plugin)  # fmt: skip
    return plugin


def test_a_vm_is_powered_on_off_and_cycled(tmp_path, vm):
    power = plugin_for(tmp_path, vm.parent)
    vm1 = machine("qemu:vm1")
    assert query_status(vm) == "prelaunch"
    assert power.provisioning_power(vm1, "on") is True
    assert query_status(vm) == "running"
    assert power.provisioning_power(vm1, "on") is True  # already on: nothing sent
    assert query_status(vm) == "running"
    assert power.provisioning_power(vm1, "off") is True
    assert query_status(vm) in (
        "prelaunch",
        "paused",
    )  # reset while stopped: QEMU 7+ says prelaunch
    assert power.provisioning_power(vm1, "cycle") is True
    assert query_status(vm) == "running"


def test_other_machines_unsafe_names_and_dead_sockets(tmp_path, vm):
    power = plugin_for(tmp_path, vm.parent, timeout=1.0)
    assert power.provisioning_power(machine("redfish://bmc:443/redfish/v1/Systems/1"), "on") is None
    assert power.provisioning_power(machine(""), "on") is None
    assert power.provisioning_power(machine("qemu:../vms/vm1"), "on") is False
    assert power.provisioning_power(machine("qemu:vm2"), "on") is False  # no such socket
    silent = vm.parent / "silent.qmp"
    with socket.socket(socket.AF_UNIX) as listener:  # accepts, never greets
        listener.bind(str(silent))
        listener.listen()
        started = time.monotonic()
        assert power.provisioning_power(machine("qemu:silent"), "on") is False
        assert time.monotonic() - started < 3
    assert query_status(vm) == "prelaunch"  # nothing reached the real VM


def test_no_directory_configured_powers_nothing(tmp_path, vm):
    plugin = QemuPowerPlugin()
    configured(tmp_path, {}, qemu_power=plugin)
    assert plugin.provisioning_power(machine("qemu:vm1"), "on") is None
    assert query_status(vm) == "prelaunch"
