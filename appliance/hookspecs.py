"""Hook specifications of the Rackboot core: the reference for plugin authors.

Hooks are grouped by the node's lifecycle. Pluggy is synchronous: hooks that
need to do I/O return :class:`~appliance.api.Service` objects for the core to
start; decision hooks (``firstresult``) stay synchronous and free of side
effects. Never write an ``async def`` hookimpl.

A plugin is a module or object registered under the ``rackboot.plugins``
entry-point group; its hook functions carry the ``@hookimpl`` marker from
:mod:`appliance.api`. Protocol plugins add hookspecs of their own through
:func:`rackboot_addhooks` so other plugins can extend them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from appliance.api import hookspec

if TYPE_CHECKING:
    import pluggy

    from appliance.api import CliCommand, Role, Section, Service
    from appliance.config import Config
    from appliance.doctor.findings import DoctorCheck, DoctorOptions
    from appliance.node import Node


# -------------------------------------------------------------------------
# Initialization: registering hooks and declaring configuration
# -------------------------------------------------------------------------


@hookspec(historic=True)
def rackboot_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Register hookspecs of your own, for other plugins to implement.

    :param pluginmanager: The Rackboot plugin manager.

    Call ``pluginmanager.add_hookspecs(module_or_class)``. This hook is
    historic: a plugin registered later still sees it called, so the order in
    which entry points load does not matter.

    Use in any plugin.
    """


@hookspec
def rackboot_config_schema() -> Section | list[Section] | None:
    """Declare this plugin's configuration section(s).

    :return: A :class:`~appliance.api.Section` (or a list of them) naming the TOML table the
        plugin owns, with a :class:`~appliance.api.Field` per key (kind,
        default, one-line doc, optional development default), or ``None``.

    The core validates the file against every declared section, so a
    plugin never sees an unknown key or a value of the wrong type. Section
    names are unique; two plugins declaring the same one is an error.
    ``rackboot config example`` renders these declarations.
    """


@hookspec
def rackboot_configure(config: Config) -> None:
    """Check cross-key rules and prepare the plugin, once, before any service starts.

    :param config: The validated configuration; ``config[name]`` is one
        section's :class:`~appliance.api.Settings`.

    Raise :class:`appliance.errors.ConfigError` (file, key path, expectation)
    for a combination of values that cannot work. Do no network I/O here.
    """


# -------------------------------------------------------------------------
# Running: services and roles
# -------------------------------------------------------------------------


@hookspec
def rackboot_services(node: Node) -> list[Service] | None:
    """Return the long-running services this plugin needs.

    :param node: The node being started; ``node.config`` holds the
        configuration, ``node.data_dir`` the plugin's writable state root.
    :return: A list of :class:`~appliance.api.Service`.

    The core starts each with ``await nursery.start(service.run, node)``; a
    service is ready only when ``task_status.started()`` is called, after
    its sockets are bound. A service that raises before it is ready stops
    the whole node with an error naming the plugin and the service.
    """


@hookspec
def rackboot_role_changed(node: Node, old: Role, new: Role) -> None:
    """The node's role changed (``standby`` <-> ``active``).

    :param node: The node.
    :param old: The previous role.
    :param new: The new role.

    Called synchronously in the node's trio thread. An ``active`` -> ``standby``
    change is announced *before* the node stops holding its rack lease:
    stop outward effects (answering dynamic DHCP, announcing addresses) at
    once. A node that elects (``[ha]`` with peers or witnesses, or
    ``backend = "etcd"``; docs/ha.md) becomes active when it acquires the
    rack's lease and goes back to standby when it loses the lease, hands it
    over (``rackboot ha demote``, maintenance) or shuts down. A node that
    elects nothing (standalone) becomes active when its services are ready
    and goes back to standby when it shuts down.
    """


# -------------------------------------------------------------------------
# Observing and operating: status and control commands
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def rackboot_firmware_updater(node: Node) -> Any | None:
    """Provide this appliance's firmware updater for the rolling update of its rack.

    :param node: The node (its configuration, data directory, ``request_stop``).
    :return: An object with the interface of
        :class:`appliance.rolling.updater.Updater` (``firmware()``, ``check(bundle)``,
        ``install(bundle)``, ``restart()``), or ``None`` to leave it to others. The
        first one returned is used; without any, the appliance's A/B slots
        (``[firmware]``, docs/updates.md) are.

    Called once, when the node's services are made. ``check`` and ``install`` run in a
    worker thread (they may block); ``restart`` in the node's trio thread.
    """


@hookspec
def rackboot_status(node: Node) -> dict[str, Any] | None:
    """Contribute to ``rackboot status``.

    :param node: The node.
    :return: A JSON-serializable mapping shown under this plugin's name,
        or ``None``. Keep it cheap: status is polled.
    """


@hookspec
def rackboot_control_commands(node: Node) -> dict[str, Callable[[dict[str, Any]], Any]] | None:
    """Add commands to the node's local control socket.

    :param node: The node.
    :return: A mapping of command name to handler. A handler takes the
        request's ``args`` (a JSON object from the CLI; treat it as
        untrusted) and returns a JSON-serializable result, directly or as
        an awaitable. Raise :class:`appliance.control.ControlRequestError`
        to refuse with a message. Names must be unique across plugins;
        prefix them with the plugin name (``"dhcp.leases"``).

    The socket is reachable only by root and the node's own user.
    """


@hookspec
def rackboot_cli_commands() -> list[CliCommand] | None:
    """Add ``rackboot`` subcommands that query the running node.

    :return: :class:`appliance.api.CliCommand` objects. Each becomes
        ``rackboot WORD... [--json] [--socket PATH] [--config FILE]``: the CLI
        sends the command's control request (with the parsed ``arguments``
        as its args) and prints ``render(result)``, or the raw JSON with
        ``--json``. Pair it with a :func:`rackboot_control_commands` handler.

    Called without configuration, before the command line is parsed: return
    the same commands whatever the configuration says.
    """


@hookspec
def rackboot_doctor_checks(options: DoctorOptions) -> list[DoctorCheck] | None:
    """Add checks to ``rackboot doctor`` (docs/cli.md, "Doctor").

    :param options: What the command line asked for
        (:class:`appliance.api.DoctorOptions`): ``dhcp_probe`` (an interface),
        ``timeout``, ``known_servers``.
    :return: :class:`appliance.api.DoctorCheck` objects, or ``None``.

    Called in the ``rackboot doctor`` process, not in the node: a check reads
    the node's status (``context.status``, ``context.section(name)``; ``None``
    when no node answers, and a check with ``needs_node`` is then skipped), the
    configuration (``context.config``) or the machine (a probe on a link), and
    returns :class:`appliance.api.Finding` lines built with ``passed``,
    ``warned``, ``failed`` or ``skipped``: a WARN or FAIL names the reason and
    what to do. Keep the verdict a pure function of the facts, so it can be
    tested without the node. A check that answers an option of ``options``
    (``DoctorCheck(option="dhcp_probe")``) is returned only when that option is
    given. Import heavy modules inside ``run``, never at import time: the CLI
    loads every plugin.
    """
