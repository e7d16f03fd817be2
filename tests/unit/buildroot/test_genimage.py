"""The genimage configurations lay out the A/B disk: a boot partition, root
slots A and B of one sane size holding the same image, and the data
partition; the boot entries post-image.sh writes find the slots."""

from __future__ import annotations

import re

import pytest

from appliance.firmware.schema import FIRMWARE
from image import layout as image_layout
from tests.unit.buildroot.genimage import parse, size_bytes
from tests.unit.buildroot.tree import TREE

BOARDS = ["x86_64", "rpi4"]
MIB = 1 << 20
DATA_LABEL = "rackboot-data"


def layout(board: str):
    """(images by name, the disk image's hdimage options, its partitions in order)."""
    root = parse(TREE / "board/rackboot" / board / "genimage.cfg")
    images = {s.title: s for s in root.children("image")}
    disks = [s for s in images.values() if s.children("hdimage")]
    assert len(disks) == 1, "one disk image"
    return images, disks[0].children("hdimage")[0].options, disks[0].children("partition")


def partition_size(images, partition) -> int:
    if "size" in partition.options:
        return size_bytes(partition.options["size"])
    return size_bytes(images[partition.options["image"]].options["size"])


@pytest.mark.parametrize("board", BOARDS)
def test_slots_a_and_b_are_twins_of_a_sane_size(board):
    images, _, partitions = layout(board)
    slots = {p.title[-1]: p for p in partitions if re.fullmatch(r"rackboot-[ab]", p.title)}
    assert set(slots) == {"a", "b"}
    a, b = slots["a"], slots["b"]
    assert a.options["image"] == b.options["image"] == "rootfs.squashfs"
    assert partition_size(images, a) == partition_size(images, b)
    assert 128 * MIB <= partition_size(images, a) <= 4096 * MIB


@pytest.mark.parametrize("board", BOARDS)
def test_boot_first_data_last(board):
    """The firmware looks at the first partition; the data partition is last so
    that a later resize can grow it to the end of the disk."""
    images, disk, partitions = layout(board)
    assert size_bytes(disk.get("align", "512")) >= MIB, "partitions aligned to 1 MiB or more"
    boot, data = partitions[0], partitions[-1]
    assert [p.title for p in partitions[1:-1]] == ["rackboot-a", "rackboot-b"]
    assert boot.options.get("bootable") == "true"
    assert 32 * MIB <= partition_size(images, boot) <= 512 * MIB
    assert data.title == "rackboot-data"
    data_image = images[data.options["image"]]
    assert data_image.options.get("empty") == "true"
    assert data_image.children("ext4")[0].options["label"] == DATA_LABEL
    assert partition_size(images, data) >= 64 * MIB


def test_data_mount_finds_the_data_partition_by_its_label():
    unit = (TREE / "board/rackboot/rootfs-overlay/usr/lib/systemd/system/data.mount").read_text()
    assert f"What=/dev/disk/by-label/{DATA_LABEL}\n" in unit


def post_image_constant(name: str) -> str:
    text = (TREE / "board/rackboot/post-image.sh").read_text()
    return re.search(rf"^{name}=(\S+)$", text, re.M)[1]


def test_x86_64_partitions_are_named_as_rackboot_firmware_finds_them():
    """[firmware] slot_a and slot_b default to /dev/disk/by-partlabel/rackboot-{a,b}; the
    Debian image's layout names them alike, and its fstab finds the ESP as 'esp'."""
    _, _, partitions = layout("x86_64")
    names = [p.title for p in partitions]
    for slot in ("a", "b"):
        device = FIRMWARE.fields[f"slot_{slot}"].default
        assert device.startswith("/dev/disk/by-partlabel/")
        assert device.rsplit("/", 1)[1] in names
    assert names == [p.name for p in image_layout.partitions()][1:]  # but GRUB's BIOS boot


def test_x86_64_boot_entries_name_the_slots_partition_uuids():
    _, disk, partitions = layout("x86_64")
    assert disk["partition-table-type"] == "gpt"
    by_title = {p.title: p.options for p in partitions}
    assert by_title["esp"]["partition-type-uuid"] == "U"
    assert by_title["rackboot-a"]["partition-uuid"] == post_image_constant("X86_64_SLOT_A_UUID")
    assert by_title["rackboot-b"]["partition-uuid"] == post_image_constant("X86_64_SLOT_B_UUID")
    for slot in ("a", "b"):  # the Debian image's, so one bundle's entries fit both
        assert by_title[f"rackboot-{slot}"]["partition-uuid"] == image_layout.SLOT_UUID[slot]


def test_rpi4_cmdlines_name_the_slots_partuuids():
    """An MBR PARTUUID is the disk signature and the partition number: the slot
    cmdlines count A as 2 and B as 3."""
    _, disk, partitions = layout("rpi4")
    assert disk["partition-table-type"] == "mbr"
    assert int(disk["disk-signature"], 16) == int(post_image_constant("RPI4_DISK_SIGNATURE"), 16)
    assert [p.title for p in partitions].index("rackboot-a") + 1 == 2
    assert [p.title for p in partitions].index("rackboot-b") + 1 == 3
    assert partitions[0].options["partition-type"].lower() == "0xc"  # FAT32 (LBA)


def test_rpi4_config_txt_boots_slot_a():
    lines = (TREE / "board/rackboot/rpi4/config.txt").read_text().splitlines()
    assert "os_prefix=slot-a/" in lines
    assert "arm_64bit=1" in lines
