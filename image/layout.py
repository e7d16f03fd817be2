"""The disk layout and the boot files of both loaders (pure: sizes in, text out).

GPT, every partition 1 MiB-aligned::

    1 bios-boot      1 MiB   GRUB's core.img (BIOS boot)
    2 esp          256 MiB   FAT: systemd-boot, GRUB's config and environment block,
                             kernel + initrd of each slot, the slots' boot entries
    3 rackboot-a   SLOT      root slot A, squashfs (read-only)
    4 rackboot-b   SLOT      root slot B
    5 rackboot-data DATA     ext4: /etc/rackboot, /var/lib/rackboot (kept across updates)
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.firmware.bootstate import grub_variables, grubenv_block
from appliance.firmware.slots import Entry, entry_name

MIB = 1 << 20
SECTOR = 512
BIOS_BOOT = "21686148-6449-6E6F-744E-656564454649"
ESP = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
ROOT_X86_64 = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"  # Discoverable Partitions Specification
LINUX_DATA = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
# Fixed partition UUIDs: the boot entries name the root slots by them.
SLOT_UUID = {
    "a": "7261636b-626f-6f74-8000-00000000000a",
    "b": "7261636b-626f-6f74-8000-00000000000b",
}
FACTORY = {"a": Entry(2), "b": Entry(1)}  # both slots hold the image; A boots first
KERNEL_OPTIONS = (
    "ro rootfstype=squashfs console=tty0 console=ttyS0,115200 systemd.volatile=state quiet"
)


@dataclass(frozen=True)
class Partition:
    number: int
    name: str
    type: str
    start: int  # bytes
    size: int  # bytes
    uuid: str = ""


def partitions(esp_mib: int = 256, slot_mib: int = 1024, data_mib: int = 256) -> list[Partition]:
    """The partitions, in order, 1 MiB-aligned after the GPT's first MiB."""
    sizes = [("bios-boot", BIOS_BOOT, 1, ""), ("esp", ESP, esp_mib, ""),
             ("rackboot-a", ROOT_X86_64, slot_mib, SLOT_UUID["a"]),
             ("rackboot-b", ROOT_X86_64, slot_mib, SLOT_UUID["b"]),
             ("rackboot-data", LINUX_DATA, data_mib, "")]  # fmt: skip
    found, start = [], MIB
    for number, (name, kind, mib, uuid) in enumerate(sizes, 1):
        if mib < 1:
            raise ValueError(f"partition {name}: {mib} MiB, expected at least 1")
        found.append(Partition(number, name, kind, start, mib * MIB, uuid))
        start += mib * MIB
    return found


def disk_size(parts: list[Partition]) -> int:
    """The image's size: the last partition's end and 1 MiB for the backup GPT."""
    return parts[-1].start + parts[-1].size + MIB


def sfdisk_script(parts: list[Partition]) -> str:
    lines = ["label: gpt", "unit: sectors", "first-lba: 2048", ""]
    for p in parts:
        uuid = f", uuid={p.uuid}" if p.uuid else ""
        lines.append(f"start={p.start // SECTOR}, size={p.size // SECTOR}, type={p.type}"
                     f"{uuid}, name={p.name}")  # fmt: skip
    return "\n".join(lines) + "\n"


def loader_conf() -> str:
    # No menu and no editor (it would hand anyone at the console a root shell); the
    # pattern matches both slots: systemd-boot's order picks (appliance/firmware/slots.py).
    return "default rackboot-*\ntimeout 0\neditor no\nconsole-mode keep\n"


def entry_text(slot: str, version: str) -> str:
    return (f"title   Rackboot {version} (slot {slot})\nversion {version}\n"
            f"linux   /rackboot/{slot}/vmlinuz\ninitrd  /rackboot/{slot}/initrd.img\n"
            f"options root=PARTUUID={SLOT_UUID[slot]} {KERNEL_OPTIONS} rackboot.slot={slot}\n")  # fmt: skip


def factory_grubenv() -> bytes:
    variables: dict[str, str] = {}
    for slot, entry in FACTORY.items():
        variables.update(grub_variables(slot, entry))
    return grubenv_block(variables)


def esp_files(version: str) -> dict[str, bytes]:
    """Every file of the ESP except the loaders' binaries and the kernels: path -> bytes."""
    files = {"loader/loader.conf": loader_conf().encode(), "grub/grubenv": factory_grubenv(),
             "grub/grub.cfg": grub_cfg().encode()}  # fmt: skip
    for slot, entry in FACTORY.items():
        files[f"loader/entries/{entry_name(slot, entry)}"] = entry_text(slot, version).encode()
        files[f"rackboot/{slot}/version"] = f"{version}\n".encode()
    return files


def _counting(slot: str) -> str:
    """GRUB script: one try moved from left to done for ``slot`` (GRUB has no
    arithmetic: the counters are small, so a chain of comparisons does it)."""
    left = "\n".join(f'  elif [ "${slot}_left" = {n} ]; then set {slot}_left={n - 1}'
                     for n in range(9, 0, -1)).replace("  elif", "  if", 1)  # fmt: skip
    done = "\n".join(f'  elif [ "${slot}_done" = {n} ]; then set {slot}_done={n + 1}'
                     for n in range(0, 9)).replace("  elif", "  if", 1)  # fmt: skip
    return (f'if [ "${slot}_left" != good -a "${slot}_left" != 0 ]; then\n'
            f"{done}\n  fi\n{left}\n  fi\n  save_env --file $envfile {slot}_left {slot}_done\nfi\n")  # fmt: skip


def grub_cfg() -> str:
    """GRUB's configuration (BIOS boot): the same choice and counting as systemd-boot
    (appliance/firmware/slots.py boot()), on the environment block."""
    entries = "\n".join(
        f'if [ "$slot" = {s} ]; then\n{_counting(s)}'
        f"  linux /rackboot/{s}/vmlinuz root=PARTUUID={SLOT_UUID[s]} {KERNEL_OPTIONS} "
        f"rackboot.slot={s}\n  initrd /rackboot/{s}/initrd.img\n  boot\nfi"
        for s in ("a", "b")
    )
    return f"""# Rackboot: slots A and B on the environment block (docs/updates.md)
serial --unit=0 --speed=115200
terminal_input serial console
terminal_output serial console
set timeout=0
set envfile=($root)/grub/grubenv
load_env --file $envfile a_gen a_left a_done b_gen b_left b_done
# Not bad first, then the newer generation (as systemd-boot sorts its entries)
if [ "$a_left" = 0 -a "$b_left" != 0 ]; then set slot=b
elif [ "$b_left" = 0 -a "$a_left" != 0 ]; then set slot=a
elif [ "$b_gen" -gt "$a_gen" ]; then set slot=b
else set slot=a
fi
echo "Rackboot: slot $slot (a: $a_gen $a_left, b: $b_gen $b_left)"
{entries}
"""
