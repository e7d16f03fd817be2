"""The ``[ra]`` configuration section (docs/ra.md).

On by default in ``auto`` mode: it answers only on interfaces where no other
IPv6 router advertises, with an advertisement that makes no host route through
the appliance, on the DHCP server's interfaces unless told others.
"""

from __future__ import annotations

from typing import Any

from appliance.api import Bool, Choice, Field, Float, List, Section, Str
from appliance.errors import ConfigError

SECTION = Section(
    "ra",
    doc="IPv6 router advertisements with router lifetime 0, so that iPXE stops waiting "
    "for one (docs/ra.md).",
    fields={
        "enabled": Field(Bool(), default=True, doc="Answer router solicitations at all."),
        "mode": Field(
            Choice("auto", "always"),
            default="auto",
            doc="'auto': only where no other router advertises (it listens first, and falls "
            "quiet when one appears); 'always': on every listed interface.",
        ),  # fmt: skip
        "interfaces": Field(
            List(Str(r"[A-Za-z0-9_.:@-]{1,15}", "an interface name")),
            default=(),
            doc="Interfaces to answer on (none: the DHCP server's interfaces; loopback never).",
        ),  # fmt: skip
        "listen": Field(
            Float(min=0.0, max=60.0),
            default=2.0,
            doc="auto: seconds to listen for other routers after soliciting them, at start.",
        ),  # fmt: skip
        "router_hold": Field(
            Float(min=10.0, max=86400.0),
            default=3600.0,
            doc="auto: seconds to stay quiet after another router's last advertisement "
            "(routers advertise at least every 1800 s), then solicit and listen again.",
        ),  # fmt: skip
    },
)


def interfaces(ra: Any, dhcp: Any | None, source: str) -> tuple[str, ...]:
    """The interfaces to answer on: ``ra.interfaces``, else the DHCP server's (when it
    serves). ConfigError for a name listed twice."""
    if ra.interfaces:
        seen: set[str] = set()
        for i, name in enumerate(ra.interfaces):
            if name in seen:
                raise ConfigError(source, f"ra.interfaces[{i}]", "each interface once", name)
            seen.add(name)
        return tuple(ra.interfaces)
    if dhcp is None or not dhcp.enabled:
        return ()
    return tuple(dhcp.interfaces)
