"""Time: is this appliance's wall clock sane and synchronized, how far off are its peers'
(sans-IO).

Leases expire by wall-clock time, and certificates (the peer links, the signed
election datagrams) are checked against it: a clock reset to 1970 by a
battery-less board refuses every peer, and two appliances drifting apart
hand out leases that end at different times. The skew to each peer comes from
what the node measures (docs/cluster.md, the keepalives; docs/state.md, the
replication pings, on the active): the doctor judges, it does not measure.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from appliance.doctor.findings import Finding, failed, passed, skipped, warned

# No wall clock before this reads true: this software did not exist yet.
EARLIEST_PLAUSIBLE = dt.datetime(2025, 1, 1, tzinfo=dt.UTC).timestamp()
SKEW_WARN = 1.0  # seconds: NTP keeps clocks within milliseconds; a second means one is not
NTP_HINT = "run an NTP client (chrony or systemd-timesyncd) on every appliance and witness"


@dataclass(frozen=True)
class ClockSync:
    """The kernel's view (adjtimex): ``synced`` None when it could not be read."""

    synced: bool | None
    max_error: float | None = None  # seconds
    why_unknown: str = ""


def _when(wall: float) -> str:
    try:
        return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return f"{wall!r} (out of range)"


def judge_clock(wall: float, sync: ClockSync) -> Finding:
    now = _when(wall)
    data = {"wall": wall, "synced": sync.synced, "max_error": sync.max_error}
    if wall < EARLIEST_PLAUSIBLE:
        return failed(
            "time.clock", f"the wall clock reads {now}, before this software was written",
            "leases would be judged by a wrong date and every peer's certificate looks "
            "not yet valid: the appliance cannot link to its rack",
            f"set the time (`date -s`, or let NTP do it) and {NTP_HINT}", data=data,
        )  # fmt: skip
    if sync.synced is False:
        return warned(
            "time.clock", f"the wall clock ({now}) is not synchronized (kernel: STA_UNSYNC)",
            "unsynchronized appliances drift apart; a standby whose clock is off by more "
            "than [ha] max_clock_skew is declared ineligible and does not take over",
            NTP_HINT, data=data,
        )  # fmt: skip
    if sync.synced is None:
        return passed("time.clock", f"{now} (sync state unknown: {sync.why_unknown})", data=data)
    error = "" if sync.max_error is None else f", max error {sync.max_error * 1000:.0f} ms"
    return passed("time.clock", f"{now}, synchronized{error}", data=data)


@dataclass(frozen=True)
class SkewSample:
    peer: str  # name or node id
    skew: float  # its wall clock minus ours, seconds
    source: str  # "cluster link" | "replication"


def skew_samples(core: Mapping[str, Any]) -> list[SkewSample]:
    """Every skew the node measured: its cluster links (both roles), its replication
    streams (the active's, per standby)."""
    site = core.get("cluster", {}).get("site", [])
    names = {row.get("node_id"): row.get("name") or row.get("node_id") for row in site}
    samples = [
        SkewSample(str(names[row.get("node_id")]), float(row["clock_skew"]), "cluster link")
        for row in site
        if not row.get("self") and row.get("state") == "up"
        and isinstance(row.get("clock_skew"), int | float)
    ]  # fmt: skip
    followers = core.get("state", {}).get("replication", {}).get("followers", {})
    for node_id, follower in sorted(followers.items()):
        if isinstance(follower.get("clock_skew"), int | float):
            samples.append(
                SkewSample(
                    str(names.get(node_id, node_id)), float(follower["clock_skew"]), "replication"
                )  # fmt: skip
            )
    return samples


def judge_skew(samples: Sequence[SkewSample], has_peers: bool, limit: float) -> Finding:
    """``has_peers``: the rack has other appliances ([ha] peers); ``limit``: [ha]
    max_clock_skew, past which the commit rule declares a standby ineligible."""
    details = tuple(f"{s.peer}: {s.skew:+.3f} s ({s.source})" for s in samples)
    data = {"samples": [s.__dict__ for s in samples], "warn": SKEW_WARN, "limit": limit}
    if not samples:
        if not has_peers:
            return skipped("time.skew", "no peer to compare clocks with (no [ha] peers, no links)")
        return warned(
            "time.skew", "no clock skew measured to this rack's peers",
            "this node has no cluster link to them, and replication measures the skew on "
            "the active only",
            "link the appliances ([cluster] mdns = true, or [cluster] peers), or run the "
            "doctor on the active", data=data,
        )  # fmt: skip
    worst = max(samples, key=lambda s: abs(s.skew))
    off = f"{worst.peer}'s clock is {worst.skew:+.3f} s off ours ({worst.source})"
    if abs(worst.skew) > limit:
        return failed(
            "time.skew", f"{off}, past [ha] max_clock_skew ({limit:g} s)",
            "a standby this far off is declared ineligible and never takes over on its own; "
            "leases would end at different times on the two appliances",
            NTP_HINT, details=details, data=data,
        )  # fmt: skip
    if abs(worst.skew) > SKEW_WARN:
        return warned(
            "time.skew", f"{off}", f"more than {SKEW_WARN:g} s: a clock is not synchronized "
            f"(the standby is declared ineligible past {limit:g} s)", NTP_HINT,
            details=details, data=data,
        )  # fmt: skip
    return passed(
        "time.skew", f"largest clock skew to a peer {worst.skew:+.3f} s ({worst.peer})",
        details=details, data=data,
    )  # fmt: skip
