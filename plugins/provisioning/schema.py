"""The ``[provisioning]`` section: the workflow's settings and the machines it starts with.

Machines listed here are the inventory's seed: the active appliance writes each
one that the rack's state does not hold yet; from then on the state is what
counts (``rackboot machines pool`` and ``reprovision`` change it there).
"""

from __future__ import annotations

from typing import Any

from appliance.api import Bool, Choice, Field, Float, Int, List, Section, Str, Table, TableList
from appliance.errors import ConfigError

from .lifecycle import Record, Timeouts

_MAC = r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"


def _seconds(default: float, doc: str) -> Field:
    return Field(Float(min=1.0, max=7 * 86400.0), default=default, doc=doc)


_TIMEOUTS = {
    "requested": _seconds(300.0, "Power-on to the machine's DHCP lease."),
    "discovered": _seconds(120.0, "DHCP lease to the boot script or loader fetched."),
    "loader": _seconds(300.0, "Loader to the kernel and every initrd fetched."),
    "kernel": _seconds(600.0, "Kernel to the installer's first event."),
    "installing": _seconds(1800.0, "Between two installer events."),
}

_MACHINE = {
    "name": Field(Str(_NAME, "a machine name"), doc="The machine's name.", example="web1"),
    "macs": Field(
        List(Str(_MAC, "a MAC address 'aa:bb:cc:dd:ee:ff'"), max_items=16),
        doc="Its network interfaces' MAC addresses.",
        example=["52:54:00:12:34:56"],
    ),  # fmt: skip
    "profile": Field(
        Str(r"([A-Za-z0-9][A-Za-z0-9._-]{0,62})?", "a profile name or ''"),
        default="",
        doc="Its boot profile ([[httpboot.profiles]]).",
    ),  # fmt: skip
    "pool": Field(
        Str(r"([A-Za-z0-9][A-Za-z0-9._-]{0,62})?", "a pool name or ''"),
        default="",
        doc="The pool of spare hardware it belongs to.",
    ),  # fmt: skip
    "power": Field(
        Str(r"([a-z][a-z0-9+.-]{0,15}:[^\s]{1,240})?", "a power address 'SCHEME:...' or ''"),
        default="",
        doc="How a power plugin reaches it (docs/power.md): 'redfish://BMC/redfish/v1/Systems/ID', 'qemu:NAME'.",
    ),  # fmt: skip
    "spare": Field(Bool(), default=False, doc="An idle spare of its pool."),
    "spare_ok": Field(
        Bool(), default=True, doc="After its retries a spare of its pool may take its profile."
    ),  # fmt: skip
    "initrds": Field(
        Int(min=0, max=16),
        default=1,
        doc="How many initrds its boot loads (the kernel stage waits for all).",
    ),  # fmt: skip
}

SECTION = Section(
    "provisioning",
    doc="Machines' provisioning: stage timeouts, retries, spares (docs/provisioning.md).",
    fields={
        "retries": Field(
            Int(min=0, max=10),
            default=2,
            doc="Power cycles after a timeout or a failure, then failed.",
        ),  # fmt: skip
        "strategy": Field(
            Choice("retry", "race"),
            default="retry",
            doc="'race': provision a spare beside each machine, release the slower one.",
        ),  # fmt: skip
        "timeouts": Field(Table(_TIMEOUTS), default={}, doc="Seconds each stage may take."),
        "machines": Field(
            TableList(_MACHINE, max_items=100_000), default=(), doc="The inventory's seed."
        ),  # fmt: skip
    },
)


def timeouts(settings: Any) -> Timeouts:
    return Timeouts(**dict(settings.timeouts))


def seed_records(settings: Any, source: str) -> list[Record]:
    """The configured machines as records; ConfigError names the key of a clash."""
    records: list[Record] = []
    names: set[str] = set()
    macs: dict[str, str] = {}
    for i, m in enumerate(settings.machines):
        path = f"provisioning.machines[{i}]"
        if m.name in names:
            raise ConfigError(source, f"{path}.name", "a name not used before", m.name)
        names.add(m.name)
        for mac in m.macs:
            if mac.lower() in macs:
                raise ConfigError(source, f"{path}.macs", f"MACs of no other machine "
                                  f"({mac} is {macs[mac.lower()]}'s)", mac)  # fmt: skip
            macs[mac.lower()] = m.name
        if m.spare and not m.pool:
            raise ConfigError(source, f"{path}.pool", "a pool (it is a spare)", has_found=False)
        records.append(Record(m.name, tuple(mac.lower() for mac in m.macs), m.profile,
                              pool=m.pool, power=m.power, spare_ok=m.spare_ok, initrds=m.initrds,
                              state="spare" if m.spare else "idle"))  # fmt: skip
    return records
