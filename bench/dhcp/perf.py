"""Running ISC perfdhcp (Debian ``kea-admin``) and reading its report.

What perfdhcp sends in the mode used here (``perfdhcp -4 -l IFACE``, no server
argument) is described in bench/README.md ("What perfdhcp sends"): it behaves as
a relay agent, so the server must accept relayed requests and answer the relay.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

LOSS_LIMIT_PCT = 1.0  # a rate is sustained when fewer than 1 % of exchanges fail
OTHERS_NOTE_PCT = (
    10.0  # show other processes' CPU use in a run's line from this much (% of one CPU)
)

_SECTION = re.compile(r"^\*+\s*Statistics for:\s*(?P<name>[A-Z0-9-]+)\s*\*+\s*$")
_RATE = re.compile(r"^Rate:\s*(?P<rate>[0-9.]+)\b")
_KV = re.compile(r"^(?P<key>[A-Za-z][A-Za-z -]*?)\s*:\s*(?P<value>-?[0-9][0-9.eE+-]*)")


def perfdhcp_argv(
    iface: str,
    rate: int,
    clients: int,
    duration: float,
    *,
    extra: list[str] | None = None,
) -> list[str]:
    """perfdhcp doing full DORA exchanges at ``rate`` per second for ``duration`` s."""
    return [
        "perfdhcp", "-4",
        "-l", iface,            # send from this interface, as a relay (giaddr = its address)
        "-r", str(rate),        # new DORA exchanges initiated per second
        "-R", str(clients),     # distinct simulated clients (MACs)
        "-p", _seconds(duration),
        *(extra or []),
    ]  # fmt: skip


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass
class Exchange:
    """One half of a DORA: DISCOVER-OFFER or REQUEST-ACK, as perfdhcp counts it."""

    sent: int = 0
    received: int = 0
    drops: int = 0
    orphans: int = 0
    rejected: int = 0
    avg_delay_ms: float | None = None


@dataclass
class PerfResult:
    offered: int  # -r
    duration: float  # -p
    exit_code: int | None
    achieved: float  # complete DORA exchanges per second (perfdhcp's "Rate:" line)
    do: Exchange = field(default_factory=Exchange)
    ra: Exchange = field(default_factory=Exchange)
    error: str | None = None  # set when the output could not be read
    others_cpu_pct: float = 0.0  # CPU (% of one) used outside the lab during the run
    others: list[str] = field(default_factory=list)  # the busiest of those processes
    server_cpu_s: float | None = None  # CPU time the server used during the run (all threads)
    client_cpu_s: float | None = None  # CPU time perfdhcp used
    server_stats: dict[str, Any] = field(default_factory=dict)  # e.g. Rackboot's state log writes
    profile: str | None = None  # the profile file of this run (--profile)
    profiles: dict[str, str] = field(default_factory=dict)  # py-spy: process label -> file

    @property
    def server_cpu_pct(self) -> float | None:
        """The server's CPU use over the run, in percent of one CPU."""
        if self.server_cpu_s is None or self.duration <= 0:
            return None
        return 100.0 * self.server_cpu_s / self.duration

    @property
    def cpu_us_per_dora(self) -> float | None:
        """Server CPU time per completed DORA exchange (both round trips), in µs."""
        if self.server_cpu_s is None or self.ra.received <= 0:
            return None
        return 1e6 * self.server_cpu_s / self.ra.received

    @property
    def loss_pct(self) -> float:
        """Share of initiated exchanges (DISCOVERs sent) that did not end in an ACK."""
        if self.error or self.do.sent <= 0:
            return 100.0
        done = min(self.ra.received, self.do.sent)
        return 100.0 * (1.0 - done / self.do.sent)

    @property
    def sustained(self) -> bool:
        return self.loss_pct < LOSS_LIMIT_PCT

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["loss_pct"] = round(self.loss_pct, 4)
        out["server_cpu_pct"] = self.server_cpu_pct
        out["cpu_us_per_dora"] = self.cpu_us_per_dora
        return out

    def short(self) -> str:
        if self.error:
            return f"offered {self.offered:>6}/s  ERROR {self.error}"
        busy = ""
        if self.others_cpu_pct >= OTHERS_NOTE_PCT:
            busy = f"  [others used {self.others_cpu_pct:.0f}% CPU: {', '.join(self.others)}]"
        cpu = ""
        if self.server_cpu_pct is not None:
            cpu = f"  server cpu {self.server_cpu_pct:3.0f}%"
            if self.cpu_us_per_dora is not None:
                cpu += f" {self.cpu_us_per_dora:4.0f} µs/DORA"
        log = self.server_stats.get("state_log") or {}
        if log.get("batches"):
            cpu += f"  log fdatasync batches {log['batches']} ({log['records'] / log['batches']:.1f} rec)"
            if log.get("write_failures"):
                cpu += f" !!! {log['write_failures']} failed writes"
            if log.get("since") == "start":
                cpu += " since node start"
        repl = self.server_stats.get("replication")
        if repl is not None:
            if repl.get("ok"):
                cpu += f"  standby has all {repl.get('active_leases')} leases"
            else:
                cpu += f"  !!! STANDBY MISMATCH: {repl.get('problem')}"
        return (
            f"offered {self.offered:>6}/s  achieved {self.achieved:>9.1f}/s  "
            f"DO {self.do.sent}/{self.do.received}  RA {self.ra.sent}/{self.ra.received}  "
            f"loss {self.loss_pct:6.2f}%{cpu}{busy}"
        )


def report_sections(text: str) -> tuple[dict[str, dict[str, float]], float | None]:
    """perfdhcp's report: every ``key: number`` of each "Statistics for" section by its
    name (DISCOVER-OFFER, REQUEST-ACK; keys lower-cased), and the achieved rate line."""
    sections: dict[str, dict[str, float]] = {}
    current: dict[str, float] | None = None
    rate: float | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _SECTION.match(line)
        if m:
            current = sections[m.group("name")] = {}
            continue
        m = _RATE.match(line)
        if m:
            rate = float(m.group("rate"))
            current = None
            continue
        if line.startswith("***"):
            current = None  # another kind of section (rate, intermediate statistics)
            continue
        m = _KV.match(line)
        if m and current is not None:
            try:
                current[m.group("key").strip().lower()] = float(m.group("value"))
            except ValueError:
                pass
    return sections, rate


def parse_perfdhcp(text: str, offered: int, duration: float, exit_code: int | None) -> PerfResult:
    """Read perfdhcp's final report. Never raises: unreadable output sets ``error``.

    Only the final report is read: with ``-t`` periodic reports the last section of
    each name wins. Unknown lines are ignored, so extra diagnostics do no harm.
    """
    sections, rate = report_sections(text)
    result = PerfResult(offered, duration, exit_code, achieved=0.0)
    do, ra = sections.get("DISCOVER-OFFER"), sections.get("REQUEST-ACK")
    if do is None or ra is None:
        tail = " | ".join(text.strip().splitlines()[-3:]) or "no output"
        result.error = f"no DISCOVER-OFFER/REQUEST-ACK statistics (exit {exit_code}): {tail}"
        return result
    result.do, result.ra = _exchange(do), _exchange(ra)
    if rate is None:  # fall back to counting: completed exchanges over the period
        rate = result.ra.received / duration if duration > 0 else 0.0
    result.achieved = rate
    return result


def _exchange(values: dict[str, float]) -> Exchange:
    def count(key: str) -> int:
        return int(values.get(key, 0))

    return Exchange(
        sent=count("sent packets"),
        received=count("received packets"),
        drops=count("drops"),
        orphans=count("orphans"),
        rejected=count("rejected leases"),
        avg_delay_ms=values.get("avg delay"),
    )
