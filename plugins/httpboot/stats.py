"""The HTTP service's counters: plain integers on the hot path, exported to
Prometheus by a collector registered in the node's own registry."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .admission import HEAD, IDLE, REFUSALS

# Why a connection was cut by the server: "request" (headers and body not in within
# request_timeout), "idle" (keep-alive with no new request within idle_timeout), "send"
# (the client took nothing for send_timeout).
TIMEOUTS = ("request", "idle", "send")
# Why a new connection got 503 and was closed (admission.py): "per-source" (its source
# holds max_per_source already), "full" (max_connections open, none to displace). A
# displaced connection is counted by what it waited for: "head" or "idle".
DISPLACED = (HEAD, IDLE)
# Why a posted event was not recorded: "standby" (this node is not the active one),
# "fenced" (it lost the lease before the record committed: neither acknowledged nor
# announced), "not-durable" (not committed within 10 s), "no-secret" (this node has no
# token secret yet to check the token with).
EVENT_REFUSALS = ("unauthorized", "invalid", "too-large", "standby", "not-durable", "fenced",
                  "no-secret")  # fmt: skip


class Stats(Collector):
    def __init__(self) -> None:
        self.active_connections = 0
        self.connections = 0
        self.rejected: Counter[str] = Counter({r: 0 for r in REFUSALS})  # 503 and closed
        self.displaced: Counter[str] = Counter({p: 0 for p in DISPLACED})  # closed for a newcomer
        self.requests: Counter[tuple[str, int]] = Counter()  # (method, status)
        self.bytes_sent = 0  # body bytes
        self.timeouts: Counter[str] = Counter({t: 0 for t in TIMEOUTS})
        self.malformed = 0  # requests h11 or the target decoder refused
        self.fenced = 0  # requests to the rack's VIP while this node did not hold the lease
        self.events_recorded: Counter[str] = Counter()  # by event status
        self.event_refusals: Counter[str] = Counter({r: 0 for r in EVENT_REFUSALS})
        self.scripts: Counter[str] = Counter()  # by profile
        self.scripts_unavailable = 0  # 503: no token secret on this node yet

    @property
    def rejected_connections(self) -> int:
        return sum(self.rejected.values())

    def count_request(self, method: str, status: int) -> None:
        known = method in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
        self.requests[(method if known else "other", status)] += 1

    def as_dict(self) -> dict[str, Any]:
        by_status: Counter[str] = Counter()
        for (_, status), n in self.requests.items():
            by_status[str(status)] += n
        return {
            "active_connections": self.active_connections,
            "connections": self.connections,
            "rejected_connections": self.rejected_connections,
            "rejected": dict(self.rejected),
            "displaced": dict(self.displaced),
            "requests": dict(sorted(by_status.items())),
            "bytes_sent": self.bytes_sent,
            "timeouts": dict(self.timeouts),
            "malformed": self.malformed,
            "fenced": self.fenced,
            "events_recorded": sum(self.events_recorded.values()),
            "event_refusals": dict(self.event_refusals),
            "scripts": dict(self.scripts),
            "scripts_unavailable": self.scripts_unavailable,
        }

    def collect(self) -> Iterator[Any]:
        active = GaugeMetricFamily("rackboot_http_active_connections", "Open HTTP connections.")
        active.add_metric([], self.active_connections)
        yield active
        yield CounterMetricFamily(
            "rackboot_http_connections", "HTTP connections accepted.", value=self.connections
        )
        rejected = CounterMetricFamily(
            "rackboot_http_rejected_connections",
            "New connections answered 503 and closed: the source at its cap, or the table full.",
            labels=["reason"],
        )
        for reason, n in sorted(self.rejected.items()):
            rejected.add_metric([reason], n)
        yield rejected
        displaced = CounterMetricFamily(
            "rackboot_http_displaced_connections",
            "Waiting connections closed to admit a source holding fewer, by what they waited for.",
            labels=["phase"],
        )
        for phase, n in sorted(self.displaced.items()):
            displaced.add_metric([phase], n)
        yield displaced
        requests = CounterMetricFamily(
            "rackboot_http_requests", "HTTP requests answered.", labels=["method", "status"]
        )
        for (method, status), n in sorted(self.requests.items()):
            requests.add_metric([method, str(status)], n)
        yield requests
        yield CounterMetricFamily(
            "rackboot_http_bytes", "Response body bytes sent.", value=self.bytes_sent
        )
        timeouts = CounterMetricFamily(
            "rackboot_http_timeouts", "Connections cut by a timeout.", labels=["phase"]
        )
        for phase, n in sorted(self.timeouts.items()):
            timeouts.add_metric([phase], n)
        yield timeouts
        yield CounterMetricFamily(
            "rackboot_http_malformed", "Requests refused as malformed (400, 403, 413, 414, 431).",
            value=self.malformed,
        )  # fmt: skip
        yield CounterMetricFamily(
            "rackboot_http_fenced", "Requests to the rack's VIP refused (503, closed) while this node did not hold the lease.",
            value=self.fenced,
        )  # fmt: skip
        recorded = CounterMetricFamily(
            "rackboot_http_events", "Installer events recorded, by status.", labels=["status"]
        )
        for event_status, n in sorted(self.events_recorded.items()):
            recorded.add_metric([event_status], n)
        yield recorded
        refused = CounterMetricFamily(
            "rackboot_http_event_refusals", "Installer events not recorded.", labels=["reason"]
        )
        for reason, n in sorted(self.event_refusals.items()):
            refused.add_metric([reason], n)
        yield refused
        scripts = CounterMetricFamily(
            "rackboot_http_boot_scripts", "iPXE scripts served, by profile.", labels=["profile"]
        )
        for profile, n in sorted(self.scripts.items()):
            scripts.add_metric([profile], n)
        yield scripts
        yield CounterMetricFamily(
            "rackboot_http_boot_scripts_unavailable",
            "iPXE scripts refused (503) because this node has no events token secret yet.",
            value=self.scripts_unavailable,
        )
