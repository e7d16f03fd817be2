"""What a plugin author imports: the hook marker, service and role types, schema kinds.

    from appliance.api import hookimpl, Service, Section, Field, Int

A plugin module (or object) implements hooks from :mod:`appliance.hookspecs`
and is registered under the ``rackboot.plugins`` entry-point group.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pluggy

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

PROJECT = "rackboot"
ENTRY_POINT_GROUP = "rackboot.plugins"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Role(enum.Enum):
    """What a node does for its rack. Only the active one answers for the rack."""

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

    ``arguments`` are ``(flags, argparse keyword arguments)`` pairs; their
    parsed values (by ``dest``) become the request's args. ``render`` turns
    the node's JSON result into lines for a person.
    """

    words: tuple[str, ...]
    help: str
    control: str
    render: Callable[[Any], str]
    arguments: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = ()
    timeout: float = 10.0  # seconds the CLI waits for the node's answer


__all__ = [
    "CliCommand",
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
    "hookimpl",
    "hookspec",
]
