"""GRUB's BIOS boot code written into a disk image file, as grub-bios-setup does for
a GPT disk with a BIOS boot partition (it insists on probing a real device; an
image file is none). Offsets from GRUB 2.06's include/grub/i386/pc/boot.h:

* the MBR gets boot.img, keeping the disk's own BPB area (0x03-0x59) and its
  signature and partition table (0x1b8-0x1ff); boot.img's "kernel sector" (0x5c)
  is core.img's first sector; its drive check (a jmp at 0x66) becomes two nops,
  for BIOSes that pass a wrong boot drive (grub-bios-setup does this for hard disks);
* core.img (diskboot.img first) goes to the BIOS boot partition; diskboot's
  block list (its sector's last 12 bytes: start u64, length u16, segment u16)
  names the rest of core.img, which follows it there.
"""

from __future__ import annotations

import struct

SECTOR = 512
BPB = slice(0x03, 0x5A)
KERNEL_SECTOR = 0x5C
DRIVE_CHECK = 0x66
TABLE = slice(0x1B8, 0x200)  # NT signature, partition table, 0x55AA
BLOCKLIST = 0x200 - 12


def boot_sector(boot_img: bytes, old_mbr: bytes, core_lba: int) -> bytes:
    if len(boot_img) != SECTOR or len(old_mbr) != SECTOR:
        raise ValueError("boot.img and the MBR are one 512-byte sector each")
    mbr = bytearray(boot_img)
    mbr[BPB] = old_mbr[BPB]
    mbr[TABLE] = old_mbr[TABLE]
    struct.pack_into("<Q", mbr, KERNEL_SECTOR, core_lba)
    mbr[DRIVE_CHECK : DRIVE_CHECK + 2] = b"\x90\x90"
    return bytes(mbr)


def core_image(core_img: bytes, core_lba: int, room: int) -> bytes:
    """core.img with its block list pointing at its own sectors from ``core_lba``;
    refused when it does not fit in ``room`` bytes."""
    sectors = -(-len(core_img) // SECTOR)
    if sectors * SECTOR > room or sectors < 2:
        raise ValueError(f"core.img of {len(core_img)} bytes does not fit the BIOS boot "
                         f"partition's {room}")  # fmt: skip
    core = bytearray(core_img.ljust(sectors * SECTOR, b"\0"))
    struct.pack_into("<QH", core, BLOCKLIST, core_lba + 1, sectors - 1)
    return bytes(core)


def install(disk: str, core_img: bytes, boot_img: bytes, start: int, size: int) -> None:
    """Write both into the image file ``disk`` (BIOS boot partition at byte ``start``)."""
    with open(disk, "r+b") as fh:
        old = fh.read(SECTOR)
        fh.seek(start)
        fh.write(core_image(core_img, start // SECTOR, size))
        fh.seek(0)
        fh.write(boot_sector(boot_img, old, start // SECTOR))
