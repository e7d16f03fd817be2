"""The core's [node] section, apart from the core plugin so that the CLI can find
the control socket without importing the plugins (see loader.node_settings)."""

from __future__ import annotations

from appliance.config import default_node_name, dev_data_dir
from appliance.schema import Bool, Field, Float, Section, Str

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"

NODE = Section(
    "node",
    doc="This appliance.",
    fields={
        "name": Field(
            Str(NAME_PATTERN, "a name of letters, digits, '.', '_' or '-' (at most 63)"),
            default=default_node_name,
            doc="Name of this appliance (default: the host name).",
        ),
        "rack": Field(
            Str(NAME_PATTERN, "a rack name of letters, digits, '.', '_' or '-' (at most 63)"),
            default="rack1",
            doc="The rack this appliance serves.",
        ),
        "data_dir": Field(
            Str(hint="an absolute directory path", pattern=r"/.*"),
            default="/var/lib/rackboot",
            dev_default=dev_data_dir,
            doc="Where state lives (leases, keys, images). Created with mode 0700.",
        ),
        "control_socket": Field(
            Str(hint="an absolute path, or '' for <data_dir>/control.sock", pattern=r"(/.*)?"),
            default="",
            doc="Unix socket the CLI talks to ('' means <data_dir>/control.sock).",
        ),
        "shutdown_grace": Field(
            Float(min=0.0, max=300.0),
            default=5.0,
            doc="Seconds a service's cleanup may take at shutdown; a shutdown stuck 5 s past it dumps stacks and exits.",
        ),
        "log_exchanges": Field(
            Bool(),
            default=False,
            doc="Log a line per DHCP message received and sent (client, address, boot file, "
            "relay) and per TFTP transfer, like dnsmasq's --log-dhcp. Off: a busy rack's "
            "boot storm would flood the log.",
        ),
    },
)
