"""What a plugin author imports: the hook markers, service, CLI and role types, the node's
description, logging, schema kinds and the doctor's check types.

    from appliance.api import hookimpl, get_logger, Service, Section, Field, Int

A plugin module (or object) implements hooks from :mod:`appliance.hookspecs`
and is registered under the ``rackboot.plugins`` entry-point group. What this
module exports is the stable plugin API (docs/plugins.md, "API stability").
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

from appliance.doctor.findings import (
    DoctorCheck,
    DoctorContext,
    DoctorOptions,
    Finding,
    Verdict,
    failed,
    passed,
    skipped,
    warned,
)
from appliance.logs import Logger, get_logger
from appliance.schema import (
    REQUIRED,
    Bool,
    Choice,
    Field,
    Float,
    Int,
    IPv4Address,
    IPv4Network,
    List,
    Section,
    Settings,
    Str,
    Table,
    TableList,
)

if TYPE_CHECKING:
    import prometheus_client
    import trio

    from appliance.config import Config
    from appliance.ha.fence import Fence
    from appliance.state.store import StateStore

PROJECT = "rackboot"
ENTRY_POINT_GROUP = "rackboot.plugins"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Role(enum.Enum):
    """What a node does for its rack: ``Role.ACTIVE`` (``"active"``) holds the rack's
    lease and answers for the rack; ``Role.STANDBY`` (``"standby"``) follows it. A
    standalone node is active from the moment its services are ready."""

    STANDBY = "standby"
    ACTIVE = "active"

    def __str__(self) -> str:
        return self.value


ServiceRunner = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Service:
    """A long-running task a plugin asks the core to start.

    ``run(node, task_status=...)`` is started with ``await nursery.start``:
    it must call ``task_status.started()`` once it is ready to serve (its
    sockets are bound), and run until cancelled. Cleanup that must outlive
    cancellation shields itself and is bounded by ``node.shutdown_grace``.
    """

    name: str
    run: ServiceRunner
    plugin: str = ""  # filled in by the core


@dataclass(frozen=True)
class CliCommand:
    """``rackboot WORD...``: a control request to the running node, rendered.

    Returned by :func:`rackboot_cli_commands`; pair it with a handler of the same
    ``control`` name from :func:`rackboot_control_commands`::

        CliCommand(
            words=("leases", "list"), help="list the DHCP leases",
            control="dhcp.leases", render=render_leases,
            arguments=((("--all",), {"action": "store_true", "help": "expired too"}),),
        )

    ``words`` are the command words (``rackboot leases list``; a first word of the
    core's own is refused). ``arguments`` are ``(flags, argparse keyword arguments)``
    pairs; their parsed values (by ``dest``) become the request's args, which the
    handler treats as untrusted. The CLI adds ``--json`` (print the result as JSON
    instead of ``render``), ``--socket``, ``--config``, ``--dev`` and
    ``--disable-plugin``. ``render`` turns the node's JSON result into text for a
    person; ``timeout`` is how long the CLI waits for the answer (exit 4 when no node
    answers, 1 with the handler's refusal).
    """

    words: tuple[str, ...]
    help: str
    control: str
    render: Callable[[Any], str]
    arguments: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = ()
    timeout: float = 10.0  # seconds the CLI waits for the node's answer


class PluginNode(Protocol):
    """The node every hook and service receives as ``node``: what a plugin may use of it.

    ``rackboot run`` runs one node per process, and a plugin object loaded from its
    entry point is registered with that node's plugin manager, so a plugin may keep
    the node it is given (``rackboot.testing`` also starts one node at a time).
    Everything not listed here is the core's own and may change in any release.
    """

    config: Config
    """The validated configuration: ``node.config["dhcp"]`` (or ``node.config.dhcp``) is
    one section's read-only :class:`Settings` (``settings.port``); ``config.source`` the
    file, ``config.dev`` whether the development defaults apply."""

    pm: pluggy.PluginManager
    """The plugin manager: call hooks (your own too) with ``node.pm.hook.NAME(...)``;
    ``node.pm.get_plugin(name)`` finds a loaded plugin."""

    data_dir: Path
    """The node's data directory (``[node] data_dir``), mode 0700. Use
    :meth:`plugin_dir` rather than writing here directly."""

    role: Role
    """``Role.ACTIVE`` or ``Role.STANDBY`` now; :func:`rackboot_role_changed` tells
    changes. To decide an outward effect ask :attr:`fence`, not the role."""

    fence: Fence
    """The fencing guard: ``node.fence.ok()`` is true only while this node holds the
    rack's lease, checked at the moment of the call (any thread may ask);
    ``fence.epoch`` is the lease's epoch (the fencing token), ``fence.vip`` the rack's
    virtual IP or ``None``, ``fence.guard_for(address)`` what to ask before speaking
    from ``address`` (``fence.ok`` for the VIP, ``None`` for the node's own)."""

    state: StateStore
    """The replicated state store (docs/plugins.md, "Replicated state"): ``get``,
    ``scan``, ``position``, ``subscribe`` on every node; ``put`` and ``append`` on the
    holder of the lease only. Created before ``rackboot_services`` is called; readable
    once the services started (``None`` in ``rackboot_configure``)."""

    metrics: prometheus_client.CollectorRegistry
    """This node's Prometheus registry (``rackboot metrics``): register your collectors
    here, never in the global registry."""

    shutdown_grace: float
    """Seconds the node gives its services to clean up after cancelling them
    (``[node] shutdown_grace``); shielded cleanup must finish within it."""

    ready: bool
    """Every service started and the node not stopping (``core.ready`` in status)."""

    stopping: trio.Event
    """Set when the node begins to stop (a signal, :meth:`request_stop`, a failed
    service)."""

    def plugin_dir(self, plugin: str) -> Path:
        """A plugin's own directory, ``data_dir/PLUGIN``, created 0700: files that are
        this appliance's alone (what the rack shares goes into :attr:`state`)."""
        ...

    def uptime(self) -> float:
        """Seconds since the node started (its trio clock)."""
        ...

    def request_stop(self, reason: str = "requested") -> None:
        """Stop the node in order, as SIGTERM does (a plugin that cannot go on)."""
        ...

    def status(self) -> dict[str, Any]:
        """What ``rackboot status`` shows: every plugin's :func:`rackboot_status`."""
        ...


__all__ = [
    "CliCommand",
    "DoctorCheck",
    "DoctorContext",
    "DoctorOptions",
    "Finding",
    "Verdict",
    "failed",
    "passed",
    "skipped",
    "warned",
    "Logger",
    "PluginNode",
    "ENTRY_POINT_GROUP",
    "REQUIRED",
    "Bool",
    "Choice",
    "Field",
    "Float",
    "IPv4Address",
    "IPv4Network",
    "Int",
    "List",
    "Role",
    "Section",
    "Service",
    "Settings",
    "Str",
    "Table",
    "TableList",
    "get_logger",
    "hookimpl",
    "hookspec",
]
