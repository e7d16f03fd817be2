"""The slots' entries where the boot loaders read them (filesystem only).

Two views of one :data:`~appliance.firmware.slots.State`, each changed one
slot at a time by one atomic file operation:

* :class:`EntriesView`, systemd-boot's (UEFI): ``ESP/loader/entries/`` holds
  ``rackboot-GEN-SLOT[+LEFT-DONE].conf``; a change is a rename.
* :class:`GrubEnvView`, GRUB's (BIOS): the 1024-byte environment block
  ``ESP/grub/grubenv`` holds ``a_gen a_left a_done b_gen ...``; a change
  rewrites the block (temporary file, fsync, rename). GRUB writes it in place
  when it counts a try (image/grub.cfg), which is why it stays one block.

FAT has no journal: Linux's vfat writes a rename's new directory entry before
it removes the old one, so a power cut can leave both names. :meth:`read`
then takes the later of the two (a newer generation; for the same one, bad
before good before counting, fewer tries left first) and the next change
removes the other; the loader itself boots an intact slot either way
(docs/updates.md).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from appliance.durable import fsync_directory
from appliance.firmware.slots import SLOTS, Entry, SlotError, State, entry_name
from appliance.firmware.slots import parse_entry_name_untrusted as _parse_name

GRUBENV_SIZE = 1024
GRUBENV_HEADER = b"# GRUB Environment Block\n"
MAX_ENTRIES = 256


class BootStateError(RuntimeError):
    """The boot loader's files are missing or not as Rackboot wrote them."""



def replace_file(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held, whenever the power goes."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def _later(entry: Entry) -> tuple[int, int, int]:
    rank = 3 if entry.bad else 2 if entry.good else 1
    return entry.generation, rank, -(entry.left or 0)


class EntriesView:
    """systemd-boot's entries: the state is in the file names."""

    name = "systemd-boot"

    def __init__(self, esp: Path) -> None:
        self.directory = Path(esp) / "loader" / "entries"

    def _files(self) -> dict[str, list[tuple[Entry, str]]]:
        try:
            names = sorted(os.listdir(self.directory))[:MAX_ENTRIES]
        except OSError as exc:
            raise BootStateError(f"{self.directory}: {exc.strerror}") from None
        found: dict[str, list[tuple[Entry, str]]] = {slot: [] for slot in SLOTS}
        for name in names:
            with contextlib.suppress(SlotError):  # another entry (a rescue system) is not ours
                slot, entry = _parse_name(name)
                found[slot].append((entry, name))
        for slot, files in found.items():
            if not files:
                raise BootStateError(f"no boot entry for slot {slot} in {self.directory} "
                                     f"(expected rackboot-GENERATION-{slot}.conf)")  # fmt: skip
            files.sort(key=lambda pair: _later(pair[0]), reverse=True)
        return found

    def read(self) -> State:
        return {slot: files[0][0] for slot, files in self._files().items()}

    def write(self, slot: str, entry: Entry) -> None:
        files = self._files()[slot]
        current = files[0][1]
        target = entry_name(slot, entry)
        if current != target:
            os.rename(self.directory / current, self.directory / target)
        for _, stale in files[1:]:  # a rename a power cut left half done
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / stale)
        fsync_directory(self.directory)


class GrubEnvView:
    """GRUB's environment block: the same state as variables."""

    name = "grub"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _variables(self) -> dict[str, str]:
        try:
            with open(self.path, "rb") as fh:
                block = fh.read(GRUBENV_SIZE + 1)
        except OSError as exc:
            raise BootStateError(f"{self.path}: {exc.strerror}") from None
        if len(block) != GRUBENV_SIZE or not block.startswith(GRUBENV_HEADER):
            raise BootStateError(f"{self.path}: not a {GRUBENV_SIZE}-byte GRUB environment block")
        variables = {}
        for line in block[len(GRUBENV_HEADER) :].decode("ascii", "replace").split("\n"):
            key, sep, value = line.partition("=")
            if sep and not key.startswith("#"):
                variables[key] = value
        return variables

    def read(self) -> State:
        variables = self._variables()
        try:
            return {slot: _entry_of(variables, slot) for slot in SLOTS}
        except (KeyError, ValueError):
            raise BootStateError(f"{self.path}: expected a_gen, a_left, a_done, b_gen, b_left "
                                 "and b_done (numbers; left may be 'good')") from None  # fmt: skip

    def write(self, slot: str, entry: Entry) -> None:
        variables = self._variables()
        variables.update(grub_variables(slot, entry))
        replace_file(self.path, grubenv_block(variables))


def _entry_of(variables: dict[str, str], slot: str) -> Entry:
    left = variables[f"{slot}_left"]
    entry = Entry(int(variables[f"{slot}_gen"]), None if left == "good" else int(left),
                  int(variables[f"{slot}_done"]))  # fmt: skip
    if not (entry.generation >= 0 and (entry.left is None or 0 <= entry.left <= 9)):
        raise ValueError(slot)
    return entry


def grub_variables(slot: str, entry: Entry) -> dict[str, str]:
    left = "good" if entry.left is None else str(entry.left)
    return {f"{slot}_gen": str(entry.generation), f"{slot}_left": left,
            f"{slot}_done": str(entry.done)}  # fmt: skip


def grubenv_block(variables: dict[str, str]) -> bytes:
    """A GRUB environment block (what grub-editenv writes): the header, the
    variables, ``#`` up to 1024 bytes."""
    body = GRUBENV_HEADER + b"".join(f"{k}={v}\n".encode() for k, v in sorted(variables.items()))
    if len(body) > GRUBENV_SIZE:
        raise BootStateError(f"GRUB environment of {len(body)} bytes, more than {GRUBENV_SIZE}")
    return body + b"#" * (GRUBENV_SIZE - len(body))
