"""The appliance's firmware: its slots, updates from bundles, the verdict after boot.

:class:`Firmware` is the API the CLI and the rolling update of a pair call::

    fw = Firmware.from_settings(config["firmware"])
    fw.status()                      # booted slot, next boot, each slot's version and state
    fw.install(path, force=False)    # verify, write + verify the other slot, promote it
    fw.reboot()                      # into it (the boot loader counts the try)
    fw.judge(healthy)                # after boot: bless a slot on trial, or mark it bad
                                     # (returns True when a reboot goes back)

Every step goes through :mod:`appliance.firmware.slots` (which step, in which
order) and is carried out on both boot loaders' views (bootstate.py), one
slot's entry at a time; an update holds an exclusive lock on
``ESP/rackboot/update.lock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.errors import RackbootError
from appliance.firmware import slots
from appliance.firmware.bootstate import BootStateError, EntriesView, GrubEnvView
from appliance.firmware.bundle import BadBundle, Bundle, read_bundle_untrusted
from appliance.firmware.keys import trusted_keys
from appliance.firmware.writer import WriteError, slot_version, verify_slot, write_slot
from appliance.logs import get_logger

log = get_logger("firmware")


class FirmwareError(RackbootError):
    """An update or verdict that cannot be carried out; the text says why."""


@dataclass
class Firmware:
    esp: Path
    devices: dict[str, Path]  # slot -> partition (or file)
    keys: dict[str, Any]  # key id -> trusted release key
    board: str = "x86_64"
    loader: str = "auto"  # whose counter is read: systemd-boot, grub, auto
    reboot_command: Sequence[str] = ("systemctl", "reboot")
    cmdline: Path = Path("/proc/cmdline")
    efi_dir: Path = Path("/sys/firmware/efi")
    run: Callable[..., Any] = subprocess.run

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> Firmware:
        return cls(
            esp=Path(settings.esp),
            devices={"a": Path(settings.slot_a), "b": Path(settings.slot_b)},
            keys=trusted_keys(settings.trusted_keys, Path(settings.release_keys_file)),
            board=settings.board,
            loader=settings.loader,
            reboot_command=tuple(settings.reboot_command),
            **overrides,
        )

    # -- reading ---------------------------------------------------------------

    def views(self) -> list[EntriesView | GrubEnvView]:
        """The boot loaders' views present on this ESP, the booted loader's first."""
        entries, grub = EntriesView(self.esp), GrubEnvView(self.esp / "grub" / "grubenv")
        present = [v for v, p in ((entries, entries.directory), (grub, grub.path)) if p.exists()]
        first = self.loader if self.loader != "auto" else (
            "systemd-boot" if self.efi_dir.exists() else "grub")  # fmt: skip
        present.sort(key=lambda v: v.name != first)
        if not present or present[0].name != first:
            raise FirmwareError(f"{self.esp}: no {first} boot state (loader/entries or "
                                "grub/grubenv); is the ESP mounted there?")  # fmt: skip
        return present

    def state(self) -> slots.State:
        try:
            return self.views()[0].read()
        except BootStateError as exc:
            raise FirmwareError(str(exc)) from None

    def booted(self) -> str | None:
        """The running slot, as the boot entry's ``rackboot.slot=`` says (None: not
        booted from a slot, e.g. a development machine)."""
        try:
            words = self.cmdline.read_text(errors="replace")[:4096].split()
        except OSError:
            return None
        found = [w.split("=", 1)[1] for w in words if w.startswith("rackboot.slot=")]
        return found[-1] if found and found[-1] in slots.SLOTS else None

    def status(self) -> dict[str, Any]:
        booted = self.booted()
        state = self.state()
        shown = slots.status(state, booted)
        for slot, info in shown["slots"].items():
            info["version"] = slot_version(self.esp, slot)
            info["device"] = str(self.devices[slot])
        shown["loader"] = self.views()[0].name
        shown["version"] = slot_version(self.esp, booted) if booted else None
        return shown

    # -- changing --------------------------------------------------------------

    def _step(self, step: slots.Step) -> None:
        """One slot's entry changed on every view (an entry change is one rename or
        one environment block write per view)."""
        slot = step.slot  # type: ignore[union-attr]
        for view in self.views():
            view.write(slot, slots.apply(view.read(), step)[slot])

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        path = self.esp / "rackboot" / "update.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise FirmwareError("another firmware update or verdict is running") from None
            yield

    def check_bundle(self, path: Path, force: bool = False) -> Bundle:
        """The bundle's verified manifest, refused (:class:`FirmwareError`) when
        its signature, payloads, board or version (unless forced) are wrong."""
        booted = self.booted()
        installed = slot_version(self.esp, booted) if booted else None
        try:
            with open(path, "rb") as fh:
                return read_bundle_untrusted(fh, self.keys, installed, self.board, force)
        except OSError as exc:
            raise FirmwareError(f"bundle {path}: {exc.strerror}") from None
        except BadBundle as exc:
            raise FirmwareError(f"bundle {path}: {exc}") from None

    def install(self, path: Path, force: bool = False) -> str:
        """Write the bundle to the slot not running and promote it; returns that
        slot. The caller reboots (:meth:`reboot`) when it chooses."""
        with self._locked():
            booted = self.booted()
            if booted is None:
                raise FirmwareError(f"not booted from a slot ({self.cmdline} has no "
                                    "rackboot.slot=a or b)")  # fmt: skip
            bundle = self.check_bundle(path, force)
            version = bundle.manifest.version
            try:
                plan = slots.plan_update(self.state(), booted, version)
            except slots.SlotError as exc:
                raise FirmwareError(str(exc)) from None
            with open(path, "rb") as source:
                for step in plan:
                    self._carry_out(step, bundle, source)
            return slots.other(booted)

    def _carry_out(self, step: slots.Step, bundle: Bundle, source: Any) -> None:
        log.info("firmware update step", step=type(step).__name__, slot=getattr(step, "slot", ""))
        try:
            match step:
                case slots.WriteSlot(slot):
                    write_slot(source, bundle, self.devices[slot], self.esp, slot)
                case slots.VerifySlot(slot):
                    verify_slot(bundle, self.devices[slot], self.esp, slot)
                case slots.MarkBad() | slots.Promote():
                    self._step(step)
        except (WriteError, BootStateError) as exc:
            raise FirmwareError(str(exc)) from None
        except OSError as exc:
            raise FirmwareError(f"{type(step).__name__}: {exc}") from None

    def judge(self, healthy: bool) -> bool:
        """The verdict on the running slot after its health check; True when the
        next boot goes to the other slot (the caller reboots)."""
        booted = self.booted()
        if booted is None:
            raise FirmwareError(f"not booted from a slot ({self.cmdline} has no rackboot.slot=)")
        with self._locked():
            before = self.state()
            after = slots.after_boot(before, booted, healthy)
            if after[booted] != before[booted]:
                for view in self.views():
                    state = view.read()
                    view.write(booted, slots.after_boot(state, booted, healthy)[booted])
                log.info("firmware slot judged", slot=booted, healthy=healthy,
                         entry=slots.entry_name(booted, after[booted]))  # fmt: skip
            return slots.must_reboot(after, booted)

    def reboot(self) -> None:
        log.warning("rebooting", command=" ".join(self.reboot_command))
        os.sync()
        self.run(list(self.reboot_command), check=True)
