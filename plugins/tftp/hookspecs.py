"""Hooks the tftp plugin offers to other plugins.

Registered by :func:`plugins.tftp.plugin.rackboot_addhooks`; names carry the
plugin's prefix (``tftp_``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from appliance.api import hookspec

if TYPE_CHECKING:
    from appliance.node import Node
    from plugins.tftp.server import Client


# -------------------------------------------------------------------------
# Serving: where a requested file comes from
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def tftp_open(path: str, client: Client, node: Node) -> bytes | os.PathLike[str] | None:
    """Provide the content of a read request dynamically (rendered per-machine
    scripts, files assembled by the image store).

    :param path: The file name the client asked for, with leading ``/``
        removed (``/pxelinux.0`` and ``pxelinux.0`` are the same request).
        It is untrusted text: it may contain ``..``, odd bytes (decoded
        like :func:`os.fsdecode`) or anything else a client can send. Match
        it against names you serve; never join it onto a directory.
    :param client: The requesting client: ``client.address`` (an
        :class:`ipaddress.IPv4Address`), ``client.port``, and
        ``client.local`` (the server address the request arrived on).
    :param node: The node whose TFTP server asks (several may run in one
        process, in tests). Take it only if you need it.
    :return: ``bytes`` to send as the file; or a path (:class:`os.PathLike`)
        of a regular file to stream, opened as given (it is *not* confined to
        the TFTP root: return only paths you own); or ``None`` to let the
        next implementation, and finally the root directory, answer.

    The first non-``None`` answer wins. To refuse a request, raise
    :class:`plugins.tftp.confine.Refused` with a TFTP error code and a
    message naming only what the client asked for; it is sent to the client
    as an ERROR. Any other exception is logged and the client gets
    ``ERROR 0`` (the root is not consulted: a broken hook must not serve a
    different file by accident).

    Called once per read request in the node's trio thread, whatever the
    node's role: keep it quick and free of side effects (no I/O beyond
    what already sits in memory).
    """


# -------------------------------------------------------------------------
# Observing: what was served
# -------------------------------------------------------------------------


@hookspec
def tftp_file_served(path: str, client: str) -> None:
    """A read request was served to its end (the client acknowledged the last block).

    :param path: The file name as the client asked for it, leading ``/`` removed
        (untrusted text, as for :func:`tftp_open`).
    :param client: The client's IPv4 address as text.

    For observers (the provisioning workflow learns that a machine fetched its
    loader or kernel). Called in the node's trio thread, whatever the node's role;
    keep it quick. An exception is logged; the transfer's outcome is unchanged.
    Costs nothing when no plugin implements it: the server asks only then.
    Implement it with ``@hookimpl(optionalhook=True)`` if your plugin must load
    without the tftp plugin.
    """
