"""The core's own hook implementations: its configuration sections and status."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from appliance import __version__
from appliance.api import Field, List, Section, Service, Str, hookimpl
from appliance.cluster.schema import SECTION as _CLUSTER
from appliance.firmware.schema import FIRMWARE as _FIRMWARE
from appliance.ha import plugin as ha
from appliance.ha.schema import SECTION as _HA
from appliance.nodesection import NODE as _NODE
from appliance.rolling import plugin as rolling
from appliance.setup import networkd
from appliance.state import plugin as state

if TYPE_CHECKING:
    from appliance.api import Role
    from appliance.node import Node


@hookimpl
def rackboot_config_schema() -> list[Section]:
    return [_NODE, _PLUGINS, _CLUSTER, _HA, _FIRMWARE, networkd.NETWORK]


_PLUGINS = Section(
    "plugins",
    doc="Which plugins run.",
    fields={
        "disabled": Field(
            List(Str()),
            default=(),
            doc="Names of plugins not to load (see `rackboot plugins list`).",
        ),
    },
)


@hookimpl
def rackboot_status(node: Node) -> dict[str, Any]:
    return {
        "name": node.config.node.name,
        "rack": node.config.node.rack,
        "version": __version__,
        "pid": os.getpid(),
        "dev": node.config.dev,
        "config": node.config.source,
        "data_dir": str(node.data_dir),
        "role": str(node.role),
        "ready": node.ready,  # every service started: what a script polls (docs/cli.md)
        "uptime": round(node.uptime(), 3),
        "services": {s.name: node.service_state[s.name] for s in node.services},
        "listeners": _listeners(node),
        "cluster": node.cluster.status() if node.cluster is not None else {"state": "off"},
        "ha": node.ha.status() if node.ha is not None else {"mode": "standalone"},
        "state": state.status(node) if node.state is not None else {},
        "rolling": rolling.status(node),
    }


def _listeners(node: Node) -> list[dict[str, Any]]:
    """What the sections declare the node binds now (`rackboot doctor` checks it holds
    them). The cluster's port is declared even without an identity (a clash must show
    before a join), but bound only by a member."""
    member = node.cluster is not None and node.cluster.identity is not None
    return [
        {"protocol": entry.protocol, "address": entry.address, "port": entry.port,
         "key": entry.keypath, "owner": entry.owner}
        for entry in node.config.listening
        if member or not entry.keypath.startswith("cluster.")
    ]  # fmt: skip


# -- the cluster (appliance/cluster, docs/cluster.md) -------------------------


@hookimpl(tryfirst=True)  # the core's services start before every plugin's
def rackboot_services(node: Node) -> list[Service]:
    from appliance.cluster.service import Cluster

    settings = node.config["cluster"]
    node.cluster = Cluster(node, settings)
    cluster = [] if settings.enabled == "off" else [Service("cluster", node.cluster.run)]
    # After the cluster (the election and replication sign with its identity); the state
    # store before the protocol plugins' services, which read it.
    return cluster + state.services(node) + ha.services(node) + rolling.services(node)


@hookimpl
def rackboot_doctor_checks(options) -> list:
    from appliance.doctor.corechecks import CHECKS

    return CHECKS


@hookimpl
def rackboot_role_changed(node: Node, old: Role, new: Role) -> None:
    if node.cluster is not None:
        node.cluster.set_role(str(new))


@hookimpl
def rackboot_control_commands(node: Node) -> dict[str, Any]:
    commands = node.cluster.control_commands() if node.cluster is not None else {}
    if node.ha is not None:
        commands.update(node.ha.control_commands())
    if node.state is not None:
        from appliance.state.backup import control_commands as state_commands

        commands.update(state_commands(node))
    commands.update(rolling.control_commands(node))
    return commands


# -- active/standby (appliance/ha, docs/ha.md) -------------------------------


@hookimpl
def rackboot_configure(config) -> None:
    ha.configure(config)
    networkd.check(config["network"], config.source)


@hookimpl
def rackboot_cli_commands():
    return ha.CLI_COMMANDS
