"""Hooks of the DHCP plugin, for plugins that extend it.

They run in the node's trio thread for every message they concern, so keep
them fast and free of I/O: look things up in memory you filled beforehand
(from a service of your own). A hook that raises is logged and ignored for
that message; the server answers as if it were absent.

Implement them like the core's hooks, with ``@hookimpl`` from
:mod:`appliance.api`; they exist once the ``dhcp`` plugin is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from appliance.api import hookspec

if TYPE_CHECKING:
    from .boot import BootChoice, BootRequest
    from .codec import Message
    from .leases import Lease
    from .model import Reservation


@hookspec(firstresult=True)
def dhcp_host_lookup(mac: str, client_id: bytes | None) -> Reservation | None:
    """Look a machine up in an external inventory.

    :param mac: ``"aa:bb:cc:dd:ee:ff"``, or ``""`` for non-Ethernet clients.
    :param client_id: Option 61 as sent, or ``None``.
    :return: A :class:`plugins.dhcp.model.Reservation` (fixed address, host
        name, boot file) for this machine, or ``None`` to leave it to the
        configured reservations and pools. Configured reservations win. Use
        addresses outside the dynamic pools.
    """


@hookspec(firstresult=True)
def dhcp_boot_selection(request: BootRequest, default: BootChoice | None) -> BootChoice | None:
    """Choose what a booting client loads first.

    :param request: The client's architecture (option 93), vendor class
        (option 60), user classes (option 77), MAC and subnet.
    :param default: What the boot table (plugins/dhcp/boot.py, overridden by
        config) chose; ``None`` when the client is not booting or the table
        has nothing for it.
    :return: A :class:`plugins.dhcp.boot.BootChoice` to use instead, or
        ``None`` to keep ``default``.
    """


@hookspec
def dhcp_reply_options(request: Message, reply: Message, lease: Lease | None) -> None:
    """Add or change options of an OFFER or ACK before it is encoded.

    :param request: The client's message (do not modify).
    :param reply: The reply; change ``reply.options`` (code -> raw bytes, see
        :mod:`plugins.dhcp.options` for encoders) or the BOOTP fields.
    :param lease: The lease an ACK grants; ``None`` for OFFER and INFORM.

    Options that do not fit the client's maximum message size make the
    server drop the private-use ones (224-254) and use a 1500-byte message.
    """


@hookspec
def dhcp_lease_committed(lease: Lease) -> None:
    """A lease was granted or renewed and its record committed in the state log (durable
    here and acknowledged by the rack's standby); its ACK has been sent.

    :param lease: The :class:`plugins.dhcp.leases.Lease`: ``address`` (an int),
        ``hwaddr`` (the MAC's bytes), ``client`` (option 61, else type and MAC),
        ``subnet``, ``hostname``, ``starts`` and ``expires`` (wall-clock seconds),
        ``state``.

    Called once, on the active appliance that granted it (a standby following the
    log is not told), in the node's trio thread: keep it quick.
    """


@hookspec
def dhcp_lease_released(lease: Lease) -> None:
    """A client released or declined its address; the record committed.

    :param lease: The :class:`plugins.dhcp.leases.Lease` as recorded;
        ``lease.state`` says which (released or declined).

    Called on the active appliance that wrote it, in the node's trio thread.
    """
