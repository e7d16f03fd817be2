"""The firmware shell on a plain-file "disk": an ESP directory laid out as image/
lays it out, slot partitions as files; an update, the verdicts, both loaders' views."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from appliance.firmware.bootstate import EntriesView, GrubEnvView
from appliance.firmware.bundle import key_id, make_bundle
from appliance.firmware.manager import Firmware, FirmwareError
from appliance.firmware.slots import Entry
from image.layout import esp_files

KEY = Ed25519PrivateKey.generate()
ROOTFS = os.urandom(3 << 20) + b"tail"  # not a multiple of the 1 MiB chunk


class Box:
    """An appliance booted from slot ``booted``; reboots are recorded, not done."""

    def __init__(self, root: Path, booted: str = "a", efi: bool = True) -> None:
        self.root, self.esp = root, root / "esp"
        for name, data in esp_files("1.0").items():
            (self.esp / name).parent.mkdir(parents=True, exist_ok=True)
            (self.esp / name).write_bytes(data)
        (root / "efi").mkdir()
        for slot in "ab":
            (root / f"slot-{slot}").write_bytes(b"\0" * (4 << 20))
        self.reboots: list[list[str]] = []
        self.firmware = Firmware(
            esp=self.esp,
            devices={s: root / f"slot-{s}" for s in "ab"},
            keys={key_id(KEY.public_key()): KEY.public_key()},
            cmdline=root / "cmdline",
            efi_dir=root / ("efi" if efi else "no-efi"),
            run=lambda argv, check: self.reboots.append(argv),
        )
        self.boot_into(booted)

    def boot_into(self, slot: str) -> None:
        (self.root / "cmdline").write_text(f"ro quiet rackboot.slot={slot}\n")

    def bundle(self, version: str, **parts: bytes) -> Path:
        path = self.root / f"rackboot-{version}.bundle"
        parts = parts or {"rootfs": ROOTFS, "kernel": b"K" * 1000, "initrd": b"I" * 2000}
        path.write_bytes(make_bundle(parts, version=version, board="x86_64", key=KEY,
                                     created=1.7e9))  # fmt: skip
        return path


def test_an_update_writes_verifies_and_promotes_the_other_slot(tmp_path):
    box = Box(tmp_path)
    assert box.firmware.status()["version"] == "1.0"
    assert box.firmware.install(box.bundle("1.1")) == "b"
    assert (tmp_path / "slot-b").read_bytes()[: len(ROOTFS)] == ROOTFS
    assert (box.esp / "rackboot/b/vmlinuz").read_bytes() == b"K" * 1000
    assert (box.esp / "rackboot/b/initrd.img").read_bytes() == b"I" * 2000
    status = box.firmware.status()
    assert status["next_boot"] == "b"
    assert status["slots"]["b"] | {"device": None} == {
        "entry": "rackboot-3-b+3-0.conf", "generation": 3, "state": "on trial",
        "tries_left": 3, "version": "1.1", "device": None}  # fmt: skip
    # GRUB's environment block says the same
    assert GrubEnvView(box.esp / "grub/grubenv").read()["b"] == Entry(3, 3, 0)
    assert not box.reboots  # the caller reboots (firmware.reboot)


def test_a_slot_on_trial_is_blessed_or_rolled_back(tmp_path):
    box = Box(tmp_path)
    box.firmware.install(box.bundle("1.1"))
    entries = box.esp / "loader/entries"
    os.rename(entries / "rackboot-3-b+3-0.conf", entries / "rackboot-3-b+2-1.conf")  # sd-boot
    box.boot_into("b")
    assert box.firmware.judge(False) is True  # bad: the next boot goes back to A
    assert sorted(os.listdir(entries)) == ["rackboot-2-a.conf", "rackboot-3-b+0-1.conf"]
    assert GrubEnvView(box.esp / "grub/grubenv").read()["b"] == Entry(3, 0, 0)
    box.boot_into("a")
    assert box.firmware.judge(False) is False  # A is good: a failed check changes nothing
    assert box.firmware.status()["slots"]["a"]["state"] == "good"
    # A good update this time
    box.firmware.install(box.bundle("1.2"))
    box.boot_into("b")
    assert box.firmware.judge(True) is False
    assert sorted(os.listdir(entries)) == ["rackboot-2-a.conf", "rackboot-4-b.conf"]
    assert box.firmware.status()["version"] == "1.2"


def test_a_bios_boot_reads_grubs_counter(tmp_path):
    box = Box(tmp_path, efi=False)
    box.firmware.install(box.bundle("1.1"))
    grub = GrubEnvView(box.esp / "grub/grubenv")
    grub.write("b", Entry(3, 2, 1))  # what GRUB's save_env does at boot
    box.boot_into("b")
    assert box.firmware.status()["loader"] == "grub"
    assert box.firmware.status()["slots"]["b"]["tries_left"] == 2
    box.firmware.judge(True)
    assert grub.read()["b"] == Entry(3) and EntriesView(box.esp).read()["b"] == Entry(3)


def test_refusals_name_the_problem_and_change_nothing(tmp_path):
    box = Box(tmp_path)
    before = sorted(os.listdir(box.esp / "loader/entries"))
    with pytest.raises(FirmwareError, match="older than the installed 1.0"):
        box.firmware.install(box.bundle("0.9"))
    stranger = Ed25519PrivateKey.generate()
    (tmp_path / "x.bundle").write_bytes(
        make_bundle({"rootfs": b"r"}, version="2.0", board="x86_64", key=stranger, created=1.0)
    )
    with pytest.raises(FirmwareError, match="not a trusted release key"):
        box.firmware.install(tmp_path / "x.bundle")
    with pytest.raises(FirmwareError, match="No such file"):
        box.firmware.install(tmp_path / "missing.bundle")
    assert sorted(os.listdir(box.esp / "loader/entries")) == before
    box.firmware.install(box.bundle("0.9"), force=True)  # forced: a downgrade is allowed
    box.boot_into("b")
    with pytest.raises(FirmwareError, match="slot b is not marked good yet"):
        box.firmware.install(box.bundle("1.5"))
    (tmp_path / "cmdline").write_text("ro quiet\n")
    with pytest.raises(FirmwareError, match="not booted from a slot"):
        box.firmware.install(box.bundle("1.6"))


def test_a_write_that_does_not_read_back_leaves_the_slot_bad(tmp_path, monkeypatch):
    box = Box(tmp_path)
    from appliance.firmware import writer

    real_copy = writer._copy

    def flips_a_bit(source, fd, payload):
        real_copy(source, fd, payload)
        if payload.name == "rootfs":
            os.pwrite(fd, b"\xff", 12345)

    monkeypatch.setattr(writer, "_copy", flips_a_bit)
    with pytest.raises(FirmwareError, match="does not read back as the bundle's rootfs"):
        box.firmware.install(box.bundle("1.1"))
    status = box.firmware.status()
    assert status["slots"]["b"]["state"] == "bad" and status["slots"]["b"]["version"] is None
    assert status["next_boot"] == "a"


def test_a_rename_cut_in_half_leaves_both_names_and_the_later_one_wins(tmp_path):
    box = Box(tmp_path)
    entries = box.esp / "loader/entries"
    shutil.copy(entries / "rackboot-1-b.conf", entries / "rackboot-1-b+0-0.conf")  # MarkBad, cut
    assert EntriesView(box.esp).read()["b"] == Entry(1, 0, 0)
    box.firmware.install(box.bundle("1.1"))
    assert sorted(os.listdir(entries)) == ["rackboot-2-a.conf", "rackboot-3-b+3-0.conf"]
    shutil.copy(entries / "rackboot-3-b+3-0.conf", entries / "rackboot-3-b+2-1.conf")  # sd-boot
    assert EntriesView(box.esp).read()["b"] == Entry(3, 2, 1)
    shutil.copy(entries / "rackboot-2-a.conf", entries / "rackboot-2-a+0-0.conf")  # MarkBad
    shutil.copy(entries / "rackboot-2-a+0-0.conf", entries / "rackboot-5-a+3-0.conf")  # Promote
    assert EntriesView(box.esp).read()["a"] == Entry(5, 3, 0)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("losetup"), reason="needs root and losetup"
)
def test_the_writer_on_a_loop_device(tmp_path):
    box = Box(tmp_path)
    backing = tmp_path / "slot-b"
    device = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    try:
        box.firmware.devices["b"] = Path(device)
        box.firmware.install(box.bundle("1.1"))
        with open(device, "rb") as fh:
            assert fh.read(len(ROOTFS)) == ROOTFS
        with pytest.raises(FirmwareError, match="holds 4194304 bytes, the image 5242880"):
            box.firmware.install(box.bundle("1.2", rootfs=os.urandom(5 << 20)))
    finally:
        subprocess.run(["losetup", "--detach", device], check=True)
