"""Which address speaks for a machine, and the boot its events token belongs to.

A machine's script carries its events token, so the script, like the events, is
answered only to the address that speaks for the MAC (``bind_tokens_to_lease``,
the default of a configured node):

* the address of its DHCP lease, bound and unexpired, in the rack's committed
  lease table (namespace ``dhcp.leases``, written by plugins/dhcp, replicated
  like every table: the standby answers the same). Through a relay the request
  comes from that leased address too;
* or the address of its DHCP reservation (``[[dhcp.reservations]]`` with a MAC).

**Boots.** The token is ``machine_token(secret, mac, nonce)`` where the nonce is
the machine's current boot's, a record of the state log (namespace
:data:`MACHINES_NS`, key the MAC: :class:`Boot`). The active node writes a new
boot, with a new random nonce, when it serves the machine a script under a lease
it has not served one under before (a new DHCP lease, so a new boot; with no lease
to tell one fetch from the next: every fetch), and answers the script only once
that record committed, so the standby holds the nonce before the installer holds
the token: after a failover the new active accepts it. The previous boot's token
is refused from then on. Events are accepted only for a MAC that has a boot record
(the only way a token of it was ever given out), so the events table is bounded by
the machines that really booted here.
"""

from __future__ import annotations

import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import trio
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from appliance.state.store import StateStore
from plugins.dhcp.leases import NAMESPACE as LEASES_NS
from plugins.dhcp.leases import CorruptRecord, Lease, LeaseState, lease_from_state_untrusted

MACHINES_NS = "httpboot.machines"
NONCE_BYTES = 16
BOOT_WAIT = 10.0  # seconds a script may wait for its boot record's commit (else 503)
_NONCE = re.compile(r"[0-9a-f]{32}")
_ADDRESS = re.compile(r"[0-9.]{7,15}")


@dataclass(frozen=True)
class Boot:
    """A machine's current boot: the nonce its token is made with, and what it was
    served under (the address, the start of the DHCP lease, None without one)."""

    mac: str
    nonce: str
    address: str
    lease: float | None
    time: float
    node: str = ""

    def value(self) -> dict[str, Any]:
        """The state entry (the MAC is its key). Spelled out: ``asdict`` deep-copies each
        field, ~25 µs of every new boot's script."""
        return {"nonce": self.nonce, "address": self.address, "lease": self.lease,
                "time": self.time, "node": self.node}  # fmt: skip


def boot_from_state_untrusted(mac: str, value: Any) -> Boot | None:
    """The boot a state entry of :data:`MACHINES_NS` holds; None for anything else (a
    machine with a malformed record is a machine without a boot: its events are refused
    until its next script)."""
    if not isinstance(value, Mapping):
        return None
    nonce, address, lease = value.get("nonce"), value.get("address"), value.get("lease")
    when, node = value.get("time"), value.get("node", "")
    if not (
        isinstance(nonce, str)
        and _NONCE.fullmatch(nonce)
        and isinstance(address, str)
        and _ADDRESS.fullmatch(address)
        and (lease is None or (isinstance(lease, int | float) and not isinstance(lease, bool)))
        and isinstance(when, int | float)
        and isinstance(node, str)
        and len(node) <= 64
    ):
        return None
    return Boot(mac, nonce, address, None if lease is None else float(lease), float(when), node)


@dataclass(frozen=True)
class Standing:
    """Why an address speaks for a MAC: ``by`` "lease", "reservation" or "unbound" (the
    binding is off), and the start of the lease it holds, if any."""

    by: str
    lease: float | None = None


Parsed = TypeVar("Parsed")
PARSED_MAX = 4096  # keys whose last parse is kept, per table


class ParsedRecords(Generic[Parsed]):
    """What ``parse(key, value)`` made of each key's last value, made again only when the
    value is another object: a committed value is never changed in place, only replaced."""

    def __init__(self, parse: Callable[[str, Any], Parsed]) -> None:
        self._parse = parse
        self._last: dict[str, tuple[Any, Parsed]] = {}

    def parse(self, key: str, value: Any) -> Parsed:
        last = self._last.get(key)
        if last is not None and last[0] is value:
            return last[1]
        parsed = self._parse(key, value)
        if len(self._last) >= PARSED_MAX:
            self._last.clear()
        self._last[key] = (value, parsed)
        return parsed


def _lease_or_none(address: str, value: Any) -> Lease | None:
    try:
        return lease_from_state_untrusted(address, value)
    except CorruptRecord:
        return None


class Machines:
    """Boot records in ``state`` and the standing of an address for a MAC, read from the
    committed tables on every node; refusals counted by route and reason."""

    def __init__(
        self,
        state: StateStore,
        *,
        reservations: Mapping[str, str],  # mac -> reserved address
        listed: Collection[str] = (),  # MACs of [[httpboot.machines]]
        bind: bool = True,
        clock: Callable[[], float] = time.time,  # wall clock: leases are wall-clock records
    ) -> None:
        self.state = state
        self.reservations = reservations
        self.listed = listed
        self.bind = bind
        self.clock = clock
        self.refusals: Counter[tuple[str, str]] = Counter()  # (route, reason)
        # The last record read of each key and what it parsed to: a refetch under the same
        # lease reads the same committed values (the tables keep them, one object each).
        self._boots = ParsedRecords(boot_from_state_untrusted)
        self._leases = ParsedRecords(_lease_or_none)

    def boot(self, mac: str) -> Boot | None:
        return self._boots.parse(mac, self.state.get(MACHINES_NS, mac))

    def standing(self, mac: str, address: str) -> Standing | None:
        """Whether ``address`` speaks for ``mac`` now; None if it does not."""
        lease = self._lease_at(address, mac)
        if lease is not None:
            return Standing("lease", lease)
        if self.reservations.get(mac) == address:
            return Standing("reservation")
        return None if self.bind else Standing("unbound")

    def _lease_at(self, address: str, mac: str) -> float | None:
        """The start of the bound, unexpired lease ``address`` holds for ``mac``, if any."""
        value = self.state.get(LEASES_NS, address)
        if value is None:
            return None
        lease = self._leases.parse(address, value)
        if lease is not None and (
            lease.state is LeaseState.BOUND
            and self.clock() < lease.expires
            and lease.hwaddr == bytes.fromhex(mac.replace(":", ""))
        ):
            return lease.starts
        return None

    def known(self, mac: str) -> bool:
        """Rackboot has heard of ``mac`` (a boot, a reservation, a configured machine):
        a refusal is then 403 (not from its address), else 404 (no such machine)."""
        return mac in self.reservations or mac in self.listed or self.boot(mac) is not None

    def reusable(self, mac: str, address: str, standing: Standing) -> Boot | None:
        """The current boot, if this script is served under the lease it was served under
        (a second fetch of the same boot): no new record, the same token."""
        if standing.lease is None:  # no lease to tell this fetch from the last one's
            return None
        boot = self.boot(mac)
        if boot is None:
            return None
        return boot if (boot.address, boot.lease) == (address, standing.lease) else None

    async def new_boot(self, mac: str, address: str, standing: Standing, node: str) -> Boot | None:
        """Record a new boot of ``mac`` (active node): the boot once committed, None if not
        within :data:`BOOT_WAIT`. :class:`NotWriter` if this node may not write."""
        boot = Boot(
            mac, secrets.token_hex(NONCE_BYTES), address, standing.lease, self.clock(), node
        )
        with trio.move_on_after(BOOT_WAIT):
            await self.state.put(MACHINES_NS, mac, boot.value())
            return boot
        return None

    def refused(self, route: str, reason: str) -> None:
        self.refusals[(route, reason)] += 1

    def status(self) -> dict[str, Any]:
        return {
            "bind_tokens_to_lease": self.bind,
            "boots": sum(1 for _ in self.state.scan(MACHINES_NS)),
            "refusals": {
                f"{route}/{reason}": n for (route, reason), n in sorted(self.refusals.items())
            },
        }


class RefusalMetrics(Collector):
    """``rackboot_http_access_refusals_total{route, reason}``: scripts and status asked by
    whom they are not for."""

    def __init__(self, machines: Machines) -> None:
        self.machines = machines

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "rackboot_http_access_refusals",
            "Requests refused for who asked: a script not from the machine's address or of an "
            "unknown machine, status without the admin token.",
            labels=["route", "reason"],
        )
        for (route, reason), n in sorted(self.machines.refusals.items()):
            family.add_metric([route, reason], n)
        yield family
