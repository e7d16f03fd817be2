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
# (without an ERROR) when the lease was lost.
OUTCOMES = ("complete", "refused", "busy", "failed", "aborted", "timeout", "fenced")


class Stats(Collector):
    """Written by the trio thread only (the pump thread hands finished transfers back)."""

    def __init__(self) -> None:
        self.active = 0
        self.transfers: Counter[str] = Counter({o: 0 for o in OUTCOMES})
        self.bytes_sent = 0
        self.retransmits = 0
        self.errors_sent: Counter[int] = Counter()  # by TFTP error code
        self.malformed = 0  # datagrams dropped: not TFTP, or not valid here
        self.send_buffer_full = 0  # times a window waited for room in its socket's buffer

    def as_dict(self) -> dict[str, Any]:
        return {
            "active_transfers": self.active,
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
