"""What the rolling update asks of each appliance's updater: the narrow interface.

The roll (appliance/rolling) never writes a slot or judges a boot itself. On
each appliance it asks an :class:`Updater`:

* :meth:`~Updater.firmware`: the version running, whether it is on trial (booted
  and not yet judged healthy), and the last version it rolled back from and why;
* :meth:`~Updater.check`: is this bundle installable here, and which version;
* :meth:`~Updater.install`: write it so that it runs after the next restart;
* :meth:`~Updater.restart`: restart into it (a reboot on a real appliance).

After the restart the updater judges the new version by its own health check
and either keeps it (no longer on trial) or rolls back to the previous one and
says so (``failed``, ``why``): the roll waits for one or the other.

On an appliance the updater is :class:`SlotUpdater`, the A/B slots of
``rackboot firmware`` (appliance/firmware, docs/updates.md), whose boot counting
and ``rackboot firmware health`` do the judging. A plugin may provide another one
through the ``rackboot_firmware_updater`` hook (the tests restart the node's
process with another version instead of rebooting).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from appliance.errors import RackbootError


class UpdateError(RackbootError):
    """A bundle this appliance cannot install, or no way to install one; says why."""


@dataclass(frozen=True)
class Firmware:
    version: str  # "" when this appliance does not know (not booted from a slot)
    trial: bool = False
    failed: str = ""  # the version it last rolled back from ("" none)
    why: str = ""
    updater: str = ""

    def status(self) -> dict[str, Any]:
        return {"version": self.version, "trial": self.trial, "failed": self.failed,
                "why": self.why, "updater": self.updater}  # fmt: skip


class Updater(Protocol):
    name: str

    def firmware(self) -> Firmware: ...

    def check(self, bundle: Path) -> str:
        """The version ``bundle`` installs here; :class:`UpdateError` if it cannot."""
        ...

    def install(self, bundle: Path) -> None: ...

    def restart(self) -> None: ...


class NoUpdater:
    """An appliance without A/B slots (a development machine): it takes part in no roll."""

    name = "none"

    def __init__(self, why: str) -> None:
        self.why = why

    def firmware(self) -> Firmware:
        return Firmware("", updater=self.name)

    def check(self, bundle: Path) -> str:
        raise UpdateError(f"this appliance cannot install firmware: {self.why}")

    install = check  # type: ignore[assignment]

    def restart(self) -> None:
        raise UpdateError(f"this appliance cannot install firmware: {self.why}")


class SlotUpdater:
    """The A/B slots of appliance/firmware: install writes the other slot and promotes it
    on trial; the boot loader counts the tries, `rackboot firmware health` (run at boot)
    marks it good, or bad and reboots back."""

    name = "slots"

    def __init__(self, firmware: Any) -> None:
        self.slots = firmware  # appliance.firmware.manager.Firmware

    def firmware(self) -> Firmware:
        from appliance.firmware.manager import FirmwareError

        try:
            status = self.slots.status()
        except FirmwareError as exc:
            return Firmware("", why=str(exc), updater=self.name)
        slots = status["slots"]
        booted = status.get("booted")
        trial = booted is not None and slots.get(booted, {}).get("state") == "on trial"
        bad = [info for slot, info in slots.items() if slot != booted and info["state"] == "bad"]
        failed = (bad[0].get("version") or "") if bad else ""
        why = "its slot was marked bad: it failed its health check or never booted" if bad else ""
        return Firmware(status.get("version") or "", trial, failed, why, self.name)

    def check(self, bundle: Path) -> str:
        from appliance.firmware.manager import FirmwareError

        try:
            return self.slots.check_bundle(bundle).manifest.version
        except FirmwareError as exc:
            raise UpdateError(str(exc)) from None

    def install(self, bundle: Path) -> None:
        from appliance.firmware.manager import FirmwareError

        try:
            self.slots.install(bundle)
        except FirmwareError as exc:
            raise UpdateError(str(exc)) from None

    def restart(self) -> None:
        self.slots.reboot()


def default_updater(node: Any) -> Updater:
    """The appliance's slots when ``[firmware] esp`` is there, else none."""
    settings = node.config["firmware"]
    if not Path(settings.esp).is_dir():
        return NoUpdater(f"no EFI system partition at {settings.esp} ([firmware] esp)")
    from appliance.firmware.manager import Firmware as Slots
    from appliance.firmware.manager import FirmwareError

    try:
        return SlotUpdater(Slots.from_settings(settings))
    except (FirmwareError, RackbootError) as exc:
        return NoUpdater(str(exc))
