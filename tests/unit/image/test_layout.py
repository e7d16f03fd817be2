"""image/: the disk layout, read back from a real partition table; the ESP's files;
GRUB's BIOS boot code in place."""

from __future__ import annotations

import fnmatch
import json
import shutil
import struct
import subprocess

import pytest

from appliance.firmware.bootstate import GRUBENV_SIZE, EntriesView, GrubEnvView
from image import biosboot, layout

MIB = layout.MIB


def test_partitions_are_aligned_in_order_and_slots_equal():
    parts = layout.partitions()
    assert [p.name for p in parts] == ["bios-boot", "esp", "rackboot-a", "rackboot-b",
                                       "rackboot-data"]  # fmt: skip
    assert all(p.start % MIB == 0 and p.size % MIB == 0 for p in parts)
    assert all(a.start + a.size == b.start for a, b in zip(parts, parts[1:], strict=False))
    assert parts[0].start == MIB and parts[2].size == parts[3].size == 1024 * MIB
    assert layout.disk_size(parts) == parts[-1].start + parts[-1].size + MIB
    with pytest.raises(ValueError, match="partition rackboot-a: 0 MiB"):
        layout.partitions(slot_mib=0)


@pytest.mark.skipif(shutil.which("sfdisk") is None, reason="sfdisk (Debian fdisk) not installed")
def test_a_small_disk_gets_the_partition_table_the_layout_says(tmp_path):
    parts = layout.partitions(esp_mib=8, slot_mib=4, data_mib=2)
    disk = tmp_path / "disk.img"
    with open(disk, "wb") as fh:
        fh.truncate(layout.disk_size(parts))
    subprocess.run(["sfdisk", "--quiet", str(disk)], input=layout.sfdisk_script(parts).encode(),
                   check=True)  # fmt: skip
    table = json.loads(subprocess.run(["sfdisk", "--json", str(disk)], check=True,
                                      capture_output=True).stdout)["partitiontable"]  # fmt: skip
    assert table["label"] == "gpt"
    got = [(p["name"], p["type"], p["start"] * 512, p["size"] * 512, p.get("uuid", ""))
           for p in table["partitions"]]  # fmt: skip
    want = [(p.name, p.type, p.start, p.size, p.uuid.upper() if p.uuid else "") for p in parts]
    assert [g[:4] for g in got] == [w[:4] for w in want]
    assert got[2][4] == layout.SLOT_UUID["a"].upper() and got[3][4] == layout.SLOT_UUID["b"].upper()


def test_the_esp_says_a_boots_first_to_both_loaders(tmp_path):
    for name, data in layout.esp_files("1.0").items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    assert EntriesView(tmp_path).read() == GrubEnvView(tmp_path / "grub/grubenv").read()
    assert EntriesView(tmp_path).read() == layout.FACTORY
    assert len((tmp_path / "grub/grubenv").read_bytes()) == GRUBENV_SIZE
    pattern = layout.loader_conf().split("\n")[0].split()[1]
    entries = sorted(p.name for p in (tmp_path / "loader/entries").iterdir())
    assert all(fnmatch.fnmatch(name, pattern) for name in entries)
    a = (tmp_path / "loader/entries/rackboot-2-a.conf").read_text()
    assert f"root=PARTUUID={layout.SLOT_UUID['a']}" in a and "rackboot.slot=a" in a
    assert "linux   /rackboot/a/vmlinuz" in a
    assert "editor no" in layout.loader_conf()  # no kernel command line edits at the console


def test_bios_boot_code_points_at_core_img():
    boot_img = bytes(range(256)) * 2
    old = bytearray(512)
    old[0x1B8:0x200] = b"\x11" * 70 + b"\x55\xaa"
    mbr = biosboot.boot_sector(boot_img, bytes(old), 2048)
    assert struct.unpack_from("<Q", mbr, 0x5C) == (2048,)
    assert mbr[0x66:0x68] == b"\x90\x90" and mbr[0x1B8:] == bytes(old[0x1B8:])
    assert mbr[:3] == boot_img[:3] and mbr[0x68:0x1B8] == boot_img[0x68:0x1B8]
    core = biosboot.core_image(b"\1" * 1000, 2048, MIB)
    assert len(core) == 1024 and struct.unpack_from("<QH", core, 0x1F4) == (2049, 1)
    with pytest.raises(ValueError, match="does not fit"):
        biosboot.core_image(b"\1" * (MIB + 1), 2048, MIB)
