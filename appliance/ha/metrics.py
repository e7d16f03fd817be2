"""The HA service's Prometheus metrics, read from its status at scrape time.

Role, epoch, validity left, transitions, and the election's refusals: those
this node's acceptor gave (by reason), requests it ignored as duplicates or
replays (by type), and why this node's own last round failed is in status.
and the datagrams the transport dropped, by reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

ROLES = ("active", "standby")


class HaCollector(Collector):
    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status

    def collect(self) -> Iterator[Any]:
        status = self.status()
        role = GaugeMetricFamily(
            "rackboot_ha_role", "1 for this node's current role.", labels=["role"]
        )
        for name in ROLES:
            role.add_metric([name], 1.0 if status.get("role") == name else 0.0)
        yield role
        yield GaugeMetricFamily(
            "rackboot_ha_epoch", "Epoch (fencing token) of the lease held; 0 when not held.",
            value=status.get("epoch") or 0,
        )  # fmt: skip
        valid_for = status.get("valid_for")
        yield GaugeMetricFamily(
            "rackboot_ha_valid_seconds",
            "Seconds of lease validity left (+Inf for a standalone node, 0 when not held).",
            value=float("inf") if valid_for is None else valid_for,
        )
        yield CounterMetricFamily(
            "rackboot_ha_renewals", "Lease renewals while holding.", value=status.get("renewals", 0)
        )
        acceptor = (status.get("election") or {}).get("acceptor") or {}
        transport = status.get("transport") or {}
        for name, doc, label, counts in (
            ("transitions", "Leases acquired and lost.", "kind", status.get("transitions")),
            ("refusals", "Requests this node's acceptor refused, by reason.", "reason",
             acceptor.get("refusals")),
            ("ignored", "Requests this node's acceptor ignored as duplicates or replays, by type.",
             "type", acceptor.get("ignored")),
            ("datagrams_dropped", "Election datagrams dropped at the trust boundary, by reason.",
             "reason", transport.get("dropped")),
        ):  # fmt: skip
            family = CounterMetricFamily(f"rackboot_ha_{name}", doc, labels=[label])
            for key, n in sorted((counts or {}).items()):
                family.add_metric([key], n)
            yield family
