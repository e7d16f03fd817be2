"""The state log's Prometheus metrics, read from its status at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class StateCollector(Collector):
    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status

    def collect(self) -> Iterator[Any]:
        status = self.status()
        yield GaugeMetricFamily("rackboot_state_lsn", "Last record committed here.",
                                value=status.get("lsn", 0))  # fmt: skip
        yield GaugeMetricFamily("rackboot_state_epoch", "Epoch of the last record committed here.",
                                value=status.get("epoch", 0))  # fmt: skip
        yield GaugeMetricFamily("rackboot_state_uncommitted",
                                "Records appended and not committed yet.",
                                value=status.get("uncommitted", 0))  # fmt: skip
        for name in ("writes", "write_failures", "compactions", "compaction_failures"):
            yield CounterMetricFamily(f"rackboot_state_{name}", f"State log {name.replace('_', ' ')}.",
                                      value=status.get(name, 0))  # fmt: skip
        replication = status.get("replication") or {}
        lag = GaugeMetricFamily("rackboot_state_follower_lag",
                                "Records the leader appended that a standby has not acknowledged.",
                                labels=["peer"])  # fmt: skip
        counted = GaugeMetricFamily("rackboot_state_follower_counted",
                                    "1 when a standby counts for commits (not declared ineligible).",
                                    labels=["peer"])  # fmt: skip
        for peer, follower in sorted((replication.get("followers") or {}).items()):
            lag.add_metric([peer], follower.get("lag", 0))
            counted.add_metric([peer], 1.0 if follower.get("counted") else 0.0)
        yield lag
        yield counted
        refused = CounterMetricFamily(
            "rackboot_state_frames_refused",
            "Replication frames refused, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted((replication.get("refused") or {}).items()):
            refused.add_metric([reason], n)
        yield refused
