"""Hooks of the HTTP-boot plugin, for plugins that extend it.

Registered by the plugin's ``rackboot_addhooks``; names carry the plugin's
prefix (``httpboot_``). Implement them with ``@hookimpl`` from
:mod:`appliance.api`; they exist once the ``httpboot`` plugin is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from appliance.api import hookspec

if TYPE_CHECKING:
    from appliance.node import Node

    from .events import Event
    from .messages import Route
    from .script import Machine


# -------------------------------------------------------------------------
# Serving: routes and boot scripts
# -------------------------------------------------------------------------


@hookspec
def httpboot_routes(node: Node) -> list[Route] | None:
    """Add HTTP routes to the server.

    :param node: The node the server runs in (``node.config``, ``node.role``,
        ``node.plugin_dir(...)`` for state of your own).
    :return: :class:`plugins.httpboot.messages.Route` objects: a method, a
        pattern such as ``/api/v1/inventory/{name}`` (``{rest:path}`` spans
        slashes), a handler and the largest request body it accepts.

    Called once when the service starts. Routes are matched in order: the
    built-in API routes first, then every plugin's, then the static files
    under ``/boot/``. A route whose method and pattern are already taken
    stops the service with an error naming both. A handler receives a
    :class:`~plugins.httpboot.messages.Request` (path already decoded and
    confined to what may name a file, parameters in ``request.params``,
    body read and size-checked) and returns a
    :class:`~plugins.httpboot.messages.Response`, directly or from an
    ``async def``. It runs in the node's trio thread: an async handler may
    await; blocking work goes to ``trio.to_thread``. An exception is logged
    and answered with a bare 500. Routes that change anything must check
    their own authorization (``plugins.httpboot.identity.bearer_untrusted``).
    """


@hookspec(firstresult=True)
def httpboot_boot_script(machine: Machine, default: str) -> str | None:
    """Choose the iPXE script a machine gets from ``/boot/{mac}.ipxe``.

    :param machine: The :class:`plugins.httpboot.script.Machine`: ``mac``
        (``aa:bb:cc:dd:ee:ff``), the ``profile`` configuration assigns it,
        ``base_url`` of this server as the machine reached it, its events
        ``token`` and ``events_url``, and the requesting ``client`` address.
    :param default: The script rendered from the profile
        (:func:`plugins.httpboot.script.render_ipxe`).
    :return: The script text to serve instead, or ``None`` to serve
        ``default``. To boot another profile, return
        ``render_ipxe(dataclasses.replace(machine, profile=other))``.

    The first non-``None`` answer wins. Called for every script request in
    the node's trio thread, whatever the node's role: keep it quick and free
    of side effects. An exception is logged and the machine gets a 500, not
    the default script: a broken policy must not start an installation.
    """


# -------------------------------------------------------------------------
# Provisioning: reacting to installers
# -------------------------------------------------------------------------


@hookspec
def httpboot_machine_event(event: Event) -> None:
    """An installer's event is recorded and durable.

    :param event: The :class:`plugins.httpboot.events.Event`: ``mac``,
        ``seq`` (per machine, rising), wall-clock ``time``, ``stage``,
        ``status`` (``started``, ``progress``, ``ok``, ``failed``),
        ``message`` and the ``client`` address that posted it.

    Called on the active node, in its trio thread, after the event is on
    disk and before the installer gets its answer, only while the node still
    holds the rack's lease: an event made durable after the lease was lost is
    not announced (the installer retries at the new active). Start slow reactions
    (power control, inventory updates) in a service of your own; an
    exception is logged and ignored.
    """
