"""The TFTP service's counters: plain integers on the hot path, exported to
Prometheus by a collector registered in the node's own registry."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# How a read request ended. "refused": an ERROR before any data (not found, access
# violation, write request, unknown mode); "busy": over max_transfers; "failed": we
# stopped with an ERROR mid-transfer (read error, file changed); "aborted": the
# client sent an ERROR; "timeout": the client went silent; "fenced": a request to the
# rack's VIP while this node did not hold the lease, or a transfer from the VIP stopped
# (without an ERROR) when the lease was lost; "busy": refused for load (admission.py:
# see REFUSALS); "evicted": its slot went to a source holding fewer; "unverified": the
# client never acknowledged anything and the transfer gave up after two retransmissions.
OUTCOMES = (
    "complete", "refused", "busy", "failed", "aborted", "timeout", "fenced", "evicted",
    "unverified",
)  # fmt: skip
# Why a request was refused for load ("busy" above): over its source's limit with its
# wait list full, the table full with no source holding more, or waited too long.
REFUSALS = ("per_source", "busy", "wait_expired")


class Stats(Collector):
    """Written by the trio thread only (the pump thread hands finished transfers back)."""

    def __init__(self) -> None:
        self.active = 0
        self.waiting = 0  # requests waiting for their source's turn (set by the server)
        self.refusals: Counter[str] = Counter({r: 0 for r in REFUSALS})
        self.transfers: Counter[str] = Counter({o: 0 for o in OUTCOMES})
        self.bytes_sent = 0
        self.retransmits = 0
        self.errors_sent: Counter[int] = Counter()  # by TFTP error code
        self.malformed = 0  # datagrams dropped: not TFTP, or not valid here
        self.send_buffer_full = 0  # times a window waited for room in its socket's buffer

    def as_dict(self) -> dict[str, Any]:
        return {
            "active_transfers": self.active,
            "waiting_requests": self.waiting,
            "refusals": dict(self.refusals),
            "transfers": dict(self.transfers),
            "bytes_sent": self.bytes_sent,
            "retransmits": self.retransmits,
            "errors_sent": {str(code): n for code, n in sorted(self.errors_sent.items())},
            "malformed": self.malformed,
            "send_buffer_full": self.send_buffer_full,
        }

    def collect(self) -> Iterator[Any]:
        active = GaugeMetricFamily(
            "rackboot_tftp_active_transfers", "TFTP read transfers in progress."
        )
        active.add_metric([], self.active)
        yield active
        waiting = GaugeMetricFamily(
            "rackboot_tftp_waiting_requests",
            "TFTP read requests waiting for their source address's turn (per-source limit).",
        )
        waiting.add_metric([], self.waiting)
        yield waiting
        refusals = CounterMetricFamily(
            "rackboot_tftp_admission_refusals",
            "TFTP read requests refused for load, by reason (never answered with more bytes "
            "than the request).",
            labels=["reason"],
        )
        for reason, n in sorted(self.refusals.items()):
            refusals.add_metric([reason], n)
        yield refusals
        transfers = CounterMetricFamily(
            "rackboot_tftp_transfers", "TFTP read requests by outcome.", labels=["outcome"]
        )
        for outcome, n in sorted(self.transfers.items()):
            transfers.add_metric([outcome], n)
        yield transfers
        yield CounterMetricFamily(
            "rackboot_tftp_bytes", "File bytes sent in DATA packets (first sends).",
            value=self.bytes_sent,
        )  # fmt: skip
        yield CounterMetricFamily(
            "rackboot_tftp_retransmits", "OACK and DATA packets sent again after a timeout or a gap.",
            value=self.retransmits,
        )  # fmt: skip
        errors = CounterMetricFamily(
            "rackboot_tftp_errors_sent", "ERROR packets sent, by TFTP error code.", labels=["code"]
        )
        for code, n in sorted(self.errors_sent.items()):
            errors.add_metric([str(code)], n)
        yield errors
        yield CounterMetricFamily(
            "rackboot_tftp_malformed", "Datagrams dropped as malformed or unexpected.",
            value=self.malformed,
        )  # fmt: skip
        yield CounterMetricFamily(
            "rackboot_tftp_send_buffer_full", "Times a transfer's socket send buffer was full and the rest of its window waited for room.",
            value=self.send_buffer_full,
        )  # fmt: skip
