"""post-image.sh and the real genimage build both disks from stand-in inputs
(random bytes for kernels, firmware and rootfs.squashfs), and the partition
tables and boot files come out as the boot entries expect."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from appliance.firmware.bundle import key_id
from appliance.firmware.keys import write_bundle
from appliance.firmware.manager import Firmware
from appliance.firmware.slots import entry_name
from image import layout as image_layout
from tests.unit.buildroot.tree import TREE

TOOLS = ("genimage", "mkfs.vfat", "mcopy", "mke2fs")
pytestmark = pytest.mark.skipif(
    any(
        shutil.which(t, path=os.environ.get("PATH", "") + ":/sbin:/usr/sbin") is None for t in TOOLS
    ),
    reason="needs genimage, dosfstools, mtools and e2fsprogs (Debian packages of those names)",
)
MIB_SECTORS = 2048
VERSION = "1.4"
STAND_INS = {
    "x86_64": [
        "efi-part/EFI/BOOT/bootx64.efi",
        "efi-part/loader/entries/buildroot.conf",
        "bzImage",
    ],
    "rpi4": [
        "rpi-firmware/start4.elf",
        "rpi-firmware/fixup4.dat",
        "rpi-firmware/overlays/miniuart-bt.dtbo",
        "Image",
        "bcm2711-rpi-4-b.dtb",
    ],
}


def build(board: str, tmp_path: Path) -> Path:
    binaries = tmp_path / "images"
    for name in [*STAND_INS[board], "rootfs.squashfs"]:
        (binaries / name).parent.mkdir(parents=True, exist_ok=True)
        (binaries / name).write_bytes(os.urandom(4096))
    (tmp_path / "target/usr/lib/rackboot").mkdir(parents=True)
    (tmp_path / "target/usr/lib/rackboot/firmware-version").write_text(f"{VERSION}\n")
    (tmp_path / "build").mkdir()
    env = dict(os.environ, BUILD_DIR=str(tmp_path / "build"), TARGET_DIR=str(tmp_path / "target"))
    env["PATH"] += ":/sbin:/usr/sbin"
    done = subprocess.run(
        [str(TREE / "board/rackboot/post-image.sh"), str(binaries), board],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return binaries


def gpt_partitions(disk: Path) -> list[tuple[str, uuid.UUID, int, int]]:
    """(name, partition UUID, first sector, sectors) of each used entry."""
    with disk.open("rb") as fh:
        fh.seek(512)
        header = fh.read(92)
        assert header[:8] == b"EFI PART"
        first_lba, count, size = struct.unpack("<QII", header[72:88])
        fh.seek(first_lba * 512)
        entries = [fh.read(size) for _ in range(count)]
    return [
        (
            e[56:128].decode("utf-16-le").rstrip("\0"),
            uuid.UUID(bytes_le=e[16:32]),
            struct.unpack("<Q", e[32:40])[0],
            struct.unpack("<Q", e[40:48])[0] - struct.unpack("<Q", e[32:40])[0] + 1,
        )
        for e in entries
        if any(e[:16])
    ]


def test_x86_64_disk(tmp_path):
    binaries = build("x86_64", tmp_path)
    partitions = gpt_partitions(binaries / "disk.img")
    assert [p[0] for p in partitions] == ["esp", "rackboot-a", "rackboot-b", "rackboot-data"]
    assert all(p[2] % MIB_SECTORS == 0 for p in partitions), "aligned to 1 MiB"
    esp = binaries / "efi-part"
    entries = esp / "loader/entries"
    # The names rackboot firmware reads, the Debian image's factory state: both good, A newer
    factory = sorted(entry_name(slot, entry) for slot, entry in image_layout.FACTORY.items())
    assert sorted(p.name for p in entries.iterdir()) == factory == [
        "rackboot-1-b.conf", "rackboot-2-a.conf"]  # fmt: skip
    for name, partition_uuid, _, _ in partitions[1:3]:
        slot = name[-1]
        (entry,) = entries.glob(f"rackboot-*-{slot}.conf")
        text = entry.read_text()
        assert f"root=PARTUUID={partition_uuid} " in text
        assert f" rackboot.slot={slot}\n" in text
        assert f"linux   /rackboot/{slot}/vmlinuz\n" in text
        assert f"version {VERSION}\n" in text
        assert (esp / f"rackboot/{slot}/vmlinuz").read_bytes() == (
            binaries / "bzImage"
        ).read_bytes()
        assert (esp / f"rackboot/{slot}/version").read_text() == f"{VERSION}\n"
    loader = (esp / "loader/loader.conf").read_text()
    assert loader == image_layout.loader_conf()  # the Debian image's: `default rackboot-*`


def test_rackboot_firmware_reads_and_updates_the_x86_64_esp(tmp_path):
    """`rackboot firmware` on what post-image.sh made: the status the Debian image shows
    at first, then an update of slot B (its partition a plain file here) to try next."""
    esp = build("x86_64", tmp_path) / "efi-part"
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("root=PARTUUID=x ro rackboot.slot=a\n")
    devices = {slot: tmp_path / f"slot-{slot}.img" for slot in ("a", "b")}
    for device in devices.values():
        device.write_bytes(b"\0" * 8192)
    key = Ed25519PrivateKey.generate()
    firmware = Firmware(esp=esp, devices=devices, keys={key_id(key.public_key()): key.public_key()},
                        loader="systemd-boot", cmdline=cmdline, efi_dir=tmp_path)  # fmt: skip
    status = firmware.status()
    assert (status["booted"], status["next_boot"], status["version"]) == ("a", "a", VERSION)
    assert {s: (i["state"], i["version"]) for s, i in status["slots"].items()} == {
        "a": ("good", VERSION), "b": ("good", VERSION)}  # fmt: skip
    rootfs, kernel = tmp_path / "rootfs.squashfs", tmp_path / "bzImage.new"
    rootfs.write_bytes(os.urandom(4096))
    kernel.write_bytes(os.urandom(2048))
    bundle = tmp_path / "1.5.bundle"
    write_bundle(bundle, {"rootfs": rootfs, "kernel": kernel}, version="1.5", board="x86_64",
                 key=key)  # fmt: skip
    assert firmware.install(bundle) == "b"
    status = firmware.status()
    assert status["next_boot"] == "b" and status["slots"]["b"]["state"] == "on trial"
    assert status["slots"]["b"]["version"] == "1.5"
    assert (esp / "rackboot/b/vmlinuz").read_bytes() == kernel.read_bytes()
    assert devices["b"].read_bytes()[:4096] == rootfs.read_bytes()
    assert sorted(p.name for p in (esp / "loader/entries").iterdir()) == [
        "rackboot-2-a.conf", "rackboot-3-b+3-0.conf"]  # fmt: skip


def test_rpi4_card(tmp_path):
    binaries = build("rpi4", tmp_path)
    mbr = (binaries / "sdcard.img").read_bytes()[:512]
    signature = struct.unpack("<I", mbr[440:444])[0]
    table = [struct.unpack("<B3xB3xII", mbr[446 + 16 * i : 462 + 16 * i]) for i in range(4)]
    assert [row[1] for row in table] == [0x0C, 0x83, 0x83, 0x83]
    assert table[0][0] == 0x80, "the boot partition is active"
    assert all(row[2] % MIB_SECTORS == 0 for row in table), "aligned to 1 MiB"
    boot = binaries / "rackboot-boot"
    for number, slot in ((2, "a"), (3, "b")):
        cmdline = (boot / f"slot-{slot}/cmdline.txt").read_text()
        assert cmdline.startswith(f"root=PARTUUID={signature:08x}-{number:02d} ")
        assert (boot / f"slot-{slot}/Image").exists()
        assert (boot / f"slot-{slot}/overlays/miniuart-bt.dtbo").exists()
    assert "os_prefix=slot-a/" in (boot / "config.txt").read_text().splitlines()
    assert "os_prefix=slot-b/" in (boot / "tryboot.txt").read_text().splitlines()
