"""Rackboot: the firmware of per-rack provisioning appliances.

``appliance`` is the minimal trio core: node lifecycle, plugin manager and
hookspecs, configuration, control socket and CLI. It knows nothing of DHCP or
TFTP; protocols live in ``plugins/`` and are loaded through entry points.
"""

__version__ = "0.1.0"
