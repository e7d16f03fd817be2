"""GRUB's side of the A/B slots, booted for real: QEMU with SeaBIOS boots a small disk
made as image/ makes it (GPT, BIOS boot partition, ESP), and image/layout.py's
grub.cfg must choose and count exactly as the slot machine's boot() does."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from appliance.firmware import slots
from appliance.firmware.bootstate import GrubEnvView, grub_variables, grubenv_block
from appliance.firmware.slots import Entry
from image import biosboot, layout
from image.build import GRUB_MODULES, GRUB_PC

TOOLS = ("qemu-system-x86_64", "grub-mkimage", "sfdisk", "mkfs.vfat", "mcopy")
pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in TOOLS) or not (GRUB_PC / "boot.img").exists(),
    reason=f"needs {', '.join(TOOLS)} and grub-pc-bin (tests/debian-packages.txt)",
)
MTOOLS = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}


def small_disk(tmp_path, state: slots.State):
    parts = layout.partitions(esp_mib=8, slot_mib=1, data_mib=1)
    disk, esp = tmp_path / "disk.img", tmp_path / "esp.img"
    with open(disk, "wb") as fh:
        fh.truncate(layout.disk_size(parts))
    subprocess.run(["sfdisk", "-q", str(disk)], input=layout.sfdisk_script(parts).encode(),
                   check=True)  # fmt: skip
    subprocess.run(["mkfs.vfat", "-C", str(esp), "8192"], check=True, capture_output=True)
    variables = {}
    for slot, entry in state.items():
        variables.update(grub_variables(slot, entry))
    (tmp_path / "grubenv").write_bytes(grubenv_block(variables))
    # No kernels on this ESP: `linux` fails, the script ends, `reboot` ends QEMU (-no-reboot)
    (tmp_path / "grub.cfg").write_text(layout.grub_cfg() + "reboot\n")
    subprocess.run(["mmd", "-i", str(esp), "::/grub"], check=True, env=MTOOLS)
    for name in ("grub.cfg", "grubenv"):
        subprocess.run(["mcopy", "-i", str(esp), str(tmp_path / name), f"::/grub/{name}"],
                       check=True, env=MTOOLS)  # fmt: skip
    by_name = {p.name: p for p in parts}
    with open(disk, "r+b") as fh:
        fh.seek(by_name["esp"].start)
        fh.write(esp.read_bytes())
    core = tmp_path / "core.img"
    subprocess.run(["grub-mkimage", "-O", "i386-pc", "-o", str(core), "-p", "(hd0,gpt2)/grub",
                    *GRUB_MODULES], check=True)  # fmt: skip
    boot = by_name["bios-boot"]
    biosboot.install(str(disk), core.read_bytes(), (GRUB_PC / "boot.img").read_bytes(),
                     boot.start, boot.size)  # fmt: skip
    return disk, by_name["esp"].start


def power_on(disk) -> str:
    # TCG: KVM on this kind of machine runs SeaBIOS poorly (appliance/lab/vm.py)
    done = subprocess.run(
        ["qemu-system-x86_64", "-m", "128", "-display", "none", "-serial", "stdio",
         "-monitor", "none", "-no-reboot", "-drive", f"file={disk},format=raw"],
        capture_output=True, timeout=120,
    )  # fmt: skip
    found = re.findall(r"Rackboot: slot ([ab]) ", done.stdout.decode(errors="replace"))
    assert found, done.stdout.decode(errors="replace")[-2000:]
    return found[0]


def test_grub_boots_and_counts_like_the_slot_machine(tmp_path):
    """B promoted (3 tries): GRUB boots B three times, counting, then A (B is bad);
    after each boot the environment block on the disk is the model's state."""
    state = {"a": Entry(2), "b": Entry(3, slots.TRIES, 0)}
    disk, esp_start = small_disk(tmp_path, state)
    seen = []
    for _ in range(slots.TRIES + 1):
        state, expected = slots.boot(state)
        seen.append(power_on(disk))
        out = tmp_path / "grubenv.out"
        subprocess.run(["mcopy", "-o", "-i", f"{disk}@@{esp_start}", "::/grub/grubenv", str(out)],
                       check=True, env=MTOOLS)  # fmt: skip
        assert (seen[-1], GrubEnvView(out).read()) == (expected, state)
    assert seen == ["b", "b", "b", "a"]
