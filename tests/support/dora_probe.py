"""A DHCP probe for an HA rack (tests/support/ha_lab.py): bench/failover/probe.py in the
client's namespace, a relay-style DISCOVER every ``period`` seconds (a full DORA for
each OFFER), every answer recorded with the appliance that sent it (the Ethernet source:
both answer from the VIP). The rack's client host needs an address (``client_addr``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.dhcplab import stop_process


class DoraProbe:
    def __init__(self, rack, path: Path, period: float = 0.005) -> None:
        self.rack, self.path, self.period = rack, path, period
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> DoraProbe:
        client = self.rack.client
        self.proc = client.popen(
            [sys.executable, "-m", "bench.failover.probe", client.addr, client.ifname,
             str(self.path), str(self.period)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGTERM, 5)

    def answers(self, kind: str = "offer") -> list[tuple[float, str]]:
        """(CLOCK_MONOTONIC time, appliance name) of every answer of ``kind`` so far."""
        names = {self.rack.hosts[n].mac: n for n in self.rack.nodes}
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        events = [json.loads(line) for line in lines[:-1] if line.strip()]  # last may be cut
        return [(e["t"], names.get(e["mac"], e["mac"])) for e in events if e["type"] == kind]

    def longest_silence(self, since: float, until: float, kind: str = "offer") -> float:
        """The longest time between two answers of ``kind`` within [since, until]."""
        times = [since, *(t for t, _ in self.answers(kind) if since <= t <= until), until]
        return max(b - a for a, b in zip(times, times[1:], strict=False))


def switch_gap(answers: list[tuple[float, str]], old: str, new: str, since: float) -> float:
    """From the old appliance's last answer to the new one's first, after ``since``; an
    answer of the old one after the new one's first fails the test (two answering)."""
    after = [(t, who) for t, who in answers if t >= since]
    first_new = min(t for t, who in after if who == new)
    last_old = max((t for t, who in answers if who == old and t < first_new), default=since)
    late = [t for t, who in after if who == old and t > first_new]
    assert not late, f"{old} answered {len(late)} times after {new} began to"
    return first_new - last_old
