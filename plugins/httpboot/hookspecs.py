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
    the node's trio thread, whatever the node's role: keep it quick, with no
    I/O (noting that the machine asked, as the provisioning plugin notes its
    loader stage, is fine; act on it in a service of your own). An exception
    is logged and the machine gets a 500, not the default script: a broken
    policy must not start an installation.
    """


@hookspec
def httpboot_file_served(path: str, client: str) -> None:
    """A file was served: for observers (a provisioning workflow's "kernel fetched").

    :param path: The file as the request named it, relative to what serves it:
        under ``/boot/`` the name below the root (``vmlinuz``,
        ``debian/initrd.gz``), any other route's file its path without the
        leading slash (``images/NAME``). Percent-decoded, never a server path.
    :param client: The requesting peer's IP address (``192.0.2.10``).

    Called once per file response (a static file, an image: what a route
    answered with :meth:`plugins.httpboot.messages.Response.file`) that is a
    ``GET`` answered 200 or 206, in the node's trio thread, once the
    response's head has left (a big file's body may still be on its way; a
    client that goes away meanwhile was still called for). Not for ``HEAD``,
    304, 416, errors or anything refused. Called on whichever node served the
    file, whatever its role. Keep it quick (a counter, a note for a service of
    your own): it runs in the request's path. An exception is logged and
    ignored: the response is not affected.

    Whether any plugin implements it is checked once when the service starts:
    with none, it costs nothing per request. Implement it with
    ``@hookimpl(optionalhook=True)``: the hook exists only while the httpboot
    plugin is loaded.
    """


# -------------------------------------------------------------------------
# Provisioning: reacting to installers
# -------------------------------------------------------------------------


@hookspec
def httpboot_machine_event(event: Event) -> None:
    """An installer's event is recorded: its record is committed in the rack's state log.

    :param event: The :class:`plugins.httpboot.events.Event`: ``mac``,
        ``seq`` (per machine, rising), wall-clock ``time``, ``stage``,
        ``status`` (``started``, ``progress``, ``ok``, ``failed``),
        ``message`` and the ``client`` address that posted it.

    Called once per committed event, on the node that recorded it (the active
    one), in its trio thread, after the commit (durable there and acknowledged
    by the standbys) and before the installer gets its 201. An event whose
    record did not commit under this node's lease (the lease was lost first) is
    not announced anywhere: the installer gets 503 and its retry is a new event
    at the new active. One that commits after the installer was told 503 (not
    committed within 10 s) is announced when it commits. The new active does
    not announce what the old one recorded, so a node that dies between the
    commit and this call leaves an event unannounced: at most once per event,
    rack-wide. A plugin that must see every event on every node (a standby's
    cache) follows the state instead: ``node.state.subscribe("httpboot.events",
    position)`` and :func:`plugins.httpboot.events.from_entry_untrusted` (see
    docs/httpboot.md, "Storage"). Start slow reactions (power control,
    inventory updates) in a service of your own; an exception is logged and
    ignored.
    """
