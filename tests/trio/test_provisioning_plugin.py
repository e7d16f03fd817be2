"""The provisioning plugin in a node (real control socket and state log, wall-clock
deadlines of a second, every test bounded): a request powers the machine on, a machine
that never gets a lease is power-cycled after its timeout and then replaced by a spare
of its pool; the records come back after a restart; the CLI's requests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest
import trio

from appliance import control
from appliance.api import hookimpl
from appliance.errors import RackbootError
from appliance.node import Node
from plugins.provisioning.lifecycle import Record
from plugins.provisioning.plugin import ProvisioningPlugin
from tests.support.plugins import configured

LIMIT = 30
DOCUMENT = {
    "provisioning": {
        "retries": 1,
        "timeouts": {"requested": 1.0},
        "machines": [
            {"name": "web1", "macs": ["52:54:00:00:00:01"], "profile": "debian", "pool": "r7"},
            {"name": "spare1", "macs": ["52:54:00:00:00:02"], "pool": "r7", "spare": True},
        ],
    }
}


class PowerLog:
    """A power plugin of the test's own: it records what it was asked."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, str]] = []

    @hookimpl
    def provisioning_power(self, machine: Record, action: str) -> bool:
        self.actions.append((machine.name, action))
        return True


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path, power: PowerLog, document: dict = DOCUMENT
) -> AsyncIterator[Node]:
    config, pm = configured(tmp_path, document, provisioning=ProvisioningPlugin(), power=power)
    node = Node(config, pm)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        yield node
        node.request_stop("test")


async def call(node: Node, cmd: str, **args):
    return await trio.to_thread.run_sync(control.call, node.control_path, cmd, args)


async def until(predicate, seconds: float) -> None:
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.05)


async def test_a_machine_without_a_lease_is_cycled_then_replaced_by_a_spare(tmp_path):
    power = PowerLog()
    with trio.fail_after(LIMIT):
        async with running(tmp_path, power) as node:
            await until(
                lambda: len(node.state.tables.data.get("provisioning.machines", {})) == 2, 5
            )
            listed = await call(node, "machines.list")
            assert [(m["name"], m["state"]) for m in listed] == [
                ("spare1", "spare"),
                ("web1", "idle"),
            ]
            shown = await call(node, "machines.reprovision", name="web1")
            assert shown["state"] == "requested"
            await until(lambda: ("spare1", "on") in power.actions, 10)
            assert power.actions == [("web1", "on"), ("web1", "cycle"), ("web1", "off"),
                                     ("spare1", "on")]  # fmt: skip
            web1 = await call(node, "machines.show", name="web1")
            assert web1["state"] == "failed" and web1["deprovision"] is True
            metrics = node.status()  # the status hook sums the states
            assert metrics["provisioning"]["states"] == {"failed": 1, "requested": 1}
        async with running(tmp_path, power) as node:  # the records are the rack's state
            spare = await call(node, "machines.show", name="spare1")
            assert spare["state"] == "requested" and spare["replaces"] == "web1"
            assert spare["profile"] == "debian"


async def test_unknown_machines_and_bad_arguments_are_refused(tmp_path):
    power = PowerLog()
    with trio.fail_after(LIMIT):
        async with running(tmp_path, power) as node:
            for cmd, args in (("machines.show", {"name": "nope"}),
                              ("machines.reprovision", {"name": "web1", "profile": 7}),
                              ("machines.pool", {"name": "web1", "pool": 3})):  # fmt: skip
                with pytest.raises(RackbootError, match="no machine named|must be text"):
                    await call(node, cmd, **args)
            assert power.actions == []


async def test_an_edited_configuration_changes_a_known_machines_hardware_not_its_state(tmp_path):
    """MACs and the power address come from the configuration (no command changes them);
    the pool, profile and stage the rack's state holds stay as the commands left them."""
    power = PowerLog()
    with trio.fail_after(LIMIT):
        async with running(tmp_path, power) as node:
            await call(node, "machines.pool", name="web1", pool="r9")
            await until(lambda: _shown(node).get("pool") == "r9", 5)  # committed
        edited = {"provisioning": {**DOCUMENT["provisioning"], "machines": [
            {"name": "web1", "macs": ["52:54:00:00:00:11"], "profile": "debian", "pool": "r7",
             "power": "redfish://bmc1/redfish/v1/Systems/1"},
            DOCUMENT["provisioning"]["machines"][1]]}}  # fmt: skip
        async with running(tmp_path, power, edited) as node:
            await until(lambda: _shown(node).get("macs") == ["52:54:00:00:00:11"], 5)
            web1 = _shown(node)
            assert web1["power"] == "redfish://bmc1/redfish/v1/Systems/1"
            assert web1["pool"] == "r9"  # the command's, not the configuration's


def _shown(node: Node) -> dict:
    value = node.state.get("provisioning.machines", "web1")
    return {} if value is None else msgpack.unpackb(value)
