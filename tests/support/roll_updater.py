"""A firmware updater for tests of the rolling update: the A/B slots of a real appliance
(appliance/firmware) kept as a file, and a restart that re-executes the node's own
process, as a reboot would start it again, without rebooting anything.

Loaded through the ``rackboot.plugins`` entry point as any plugin
(:func:`write_distribution` makes one), it implements the
``rackboot_firmware_updater`` hook (appliance/rolling/updater.py):

* a bundle is a JSON file ``{"version": V, "health": "ok" | "fail: WHY"}``;
* ``install`` writes it to the slot not running and makes it next, on trial;
* ``restart`` stops the node gracefully (it releases what it holds), and the
  process executes itself again at exit: the same PID, its output, its arguments;
* booted on trial, it judges the slot once the node is ready, as
  ``rackboot firmware health`` does: ``ok`` marks it good; ``fail`` marks it bad,
  records why, and restarts into the previous slot, which is then what runs.

``[test_updater] version`` is the version of the slot the appliance starts with.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path
from typing import Any

import trio

from appliance.api import Field, Section, Service, Str, hookimpl
from appliance.rolling.updater import Firmware, UpdateError

STATE = "test-updater.json"
READY_WAIT = 60.0  # s a slot on trial waits for its node to be ready before it is judged

SECTION = Section(
    "test_updater",
    doc="The test firmware updater (tests/support/roll_updater.py).",
    fields={"version": Field(Str(), default="1.0", doc="The first slot's version.")},
)


class SlotFile:
    """Slots ``a`` and ``b`` and which one boots, in ``<data_dir>/test-updater.json``."""

    def __init__(self, data_dir: Path, first: str) -> None:
        self.path = data_dir / STATE
        if not self.path.exists():
            self.write({"booted": "a", "next": "a", "trial": False, "failed": "", "why": "",
                        "slots": {"a": {"version": first, "health": "ok", "good": True},
                                  "b": None}})  # fmt: skip

    def read(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())

    def write(self, state: dict[str, Any]) -> None:
        part = self.path.with_suffix(".part")
        part.write_text(json.dumps(state))
        os.replace(part, self.path)

    def boot(self) -> dict[str, Any]:
        """What the boot loader does at start: the next slot boots, on trial until it
        was judged good."""
        state = self.read()
        if state["next"] != state["booted"]:
            state["booted"] = state["next"]
            state["trial"] = not state["slots"][state["booted"]]["good"]
            self.write(state)
        return state


def other(slot: str) -> str:
    return "b" if slot == "a" else "a"


class TestUpdater:
    name = "test"

    def __init__(self, node: Any) -> None:
        self.node = node
        self.slots = SlotFile(Path(node.data_dir), node.config["test_updater"].version)
        self.state = self.slots.boot()

    def firmware(self) -> Firmware:
        state = self.state
        version = state["slots"][state["booted"]]["version"]
        return Firmware(version, state["trial"], state["failed"], state["why"], self.name)

    def check(self, bundle: Path) -> str:
        try:
            content = json.loads(Path(bundle).read_text())
            version = content["version"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UpdateError(f"{bundle}: not a test bundle ({exc})") from None
        if version == self.firmware().version:
            raise UpdateError(f"this appliance runs {version} already")
        return version

    def install(self, bundle: Path) -> None:
        content = json.loads(Path(bundle).read_text())
        state = self.slots.read()
        target = other(state["booted"])
        state["slots"][target] = {"version": content["version"],
                                  "health": content.get("health", "ok"), "good": False}  # fmt: skip
        state["next"] = target
        self.slots.write(state)

    def restart(self) -> None:
        argv = [sys.executable, *sys.orig_argv[1:]]
        atexit.register(os.execv, sys.executable, argv)  # after the graceful stop
        self.node.request_stop("restarting into the next slot (test updater)")

    async def judge(self, node: Any, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """A slot on trial: judged once the node is ready (its health check)."""
        task_status.started()
        if not self.state["trial"]:
            return
        with trio.move_on_after(READY_WAIT):
            while not node.ready:
                await trio.sleep(0.1)
        state = self.slots.read()
        slot = state["booted"]
        health = state["slots"][slot]["health"]
        state["trial"] = False
        if health == "ok" and node.ready:
            state["slots"][slot]["good"] = True
            self.slots.write(state)
            self.state = state
            return
        state["failed"] = state["slots"][slot]["version"]
        state["why"] = health.partition(":")[2].strip() or "the node did not become ready"
        state["next"] = other(slot)  # back to the slot it came from
        self.slots.write(state)
        self.state = {**state, "trial": True}  # until the restart, still the bad slot
        self.restart()


@hookimpl
def rackboot_config_schema() -> Section:
    return SECTION


@hookimpl
def rackboot_firmware_updater(node: Any) -> TestUpdater:
    node.test_updater = TestUpdater(node)
    return node.test_updater


@hookimpl
def rackboot_services(node: Any) -> list[Service]:
    updater = getattr(node, "test_updater", None)
    return [] if updater is None else [Service("test-updater", updater.judge)]


def write_distribution(directory: Path) -> Path:
    """A distribution's metadata under ``directory`` naming this module as a
    ``rackboot.plugins`` entry point; put ``directory`` (and the repository, for
    ``tests``) on ``PYTHONPATH`` of the node's process."""
    info = directory / "rackboot_test_updater-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rackboot-test-updater\n"
                                   "Version: 1.0\n")  # fmt: skip
    (info / "entry_points.txt").write_text(
        "[rackboot.plugins]\ntest_updater = tests.support.roll_updater\n"
    )
    return directory
