"""Hooks of the provisioning plugin: power control of the machines it provisions.

Implement with ``@hookimpl`` from :mod:`appliance.api`. A power plugin (Redfish for
servers, QEMU for test VMs, IPMI, a PDU...) answers for the machines it knows and
returns ``None`` for the others; the first that takes an action wins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from appliance.api import hookspec

if TYPE_CHECKING:
    from .lifecycle import Record


@hookspec(firstresult=True)
def provisioning_power(machine: Record, action: str) -> bool | None:
    """Power a machine ``on``, ``off`` or ``cycle`` it (off then on, or a reset).

    :param machine: The machine's :class:`plugins.provisioning.lifecycle.Record`
        (``name``, ``macs``, ``pool``...).
    :param action: ``"on"``, ``"off"`` or ``"cycle"``.
    :return: ``True`` once the action was taken, ``False`` if it failed, ``None``
        when this plugin does not manage the machine.

    Called on the appliance that holds the rack's lease, in a worker thread (it
    may block on the network for a few seconds). A machine no plugin powers is
    left to its deadline: the workflow goes on, and the failure is counted.
    """
