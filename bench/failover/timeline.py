"""Where a kill's renewal gap goes: each kill of a bench.failover run, step by step.

    python -m bench.failover.timeline KEEP_DIR RESULT_JSON

KEEP_DIR is what ``python -m bench.failover --keep KEEP_DIR`` copied (the nodes'
logs, the probes' events); RESULT_JSON the run's bench/results file. For each
kill with traffic, times from the kill (s): the new active's ``lease
acquired``, ``dhcp answering the pools`` and ``took the virtual IP`` (its log,
wall clock), the first OFFER and the first DORA ACK from it (the relay-style
probe; an ACK needs a commit, an OFFER does not), the first renewal frame the
clients addressed to its MAC (their ARP entry for the VIP moved), the renewal
that got the first ACK from it (sent when), and that ACK. Medians at the end.
"""

from __future__ import annotations

import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

STEPS = ("acquired", "pools", "vip", "offer", "dora_ack", "arp", "renewal_sent", "renewal_ack")
LOG_STEPS = {'msg="lease acquired"': "acquired", 'msg="dhcp answering the pools"': "pools",
             'msg="took the virtual IP"': "vip"}  # fmt: skip


def log_times(path: Path) -> list[tuple[float, str]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        for needle, step in LOG_STEPS.items():
            if needle in line and line.startswith("ts="):
                stamp = line[3:].split(" ", 1)[0].replace("Z", "+00:00")
                out.append((datetime.fromisoformat(stamp).timestamp(), step))
    return out


def events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def timeline(trial: dict, logs: dict[str, list], probe: list[dict], renew: list[dict],
             macs: dict[str, str]) -> dict[str, float | None]:  # fmt: skip
    new = "b" if trial["dead"] == "a" else "a"
    new_mac = macs.get(new, "")
    k, kw = trial["killed"], trial["killed_wall"]
    row: dict[str, float | None] = dict.fromkeys(STEPS)
    for wall, step in logs.get(new, []):
        if wall > kw and row[step] is None:
            row[step] = wall - kw
    for e in probe:
        if e["t"] <= k or e["mac"] != new_mac:
            continue
        if e["type"] == "offer" and row["offer"] is None:
            row["offer"] = e["t"] - k
        if e["type"] == "ack" and row["dora_ack"] is None:
            row["dora_ack"] = e["t"] - k
    sent = {e["xid"]: e["t"] for e in renew if e["type"] == "renew"}
    for e in renew:
        if e["t"] <= k:
            continue
        if e["type"] == "wire" and e["dst_mac"] == new_mac and row["arp"] is None:
            row["arp"] = e["t"] - k
        if (
            e["type"] == "ack"
            and e["renewal"]
            and e["mac"] == new_mac
            and row["renewal_ack"] is None
        ):
            row["renewal_ack"] = e["t"] - k
            row["renewal_sent"] = sent.get(e["xid"], k) - k
    return row


def main(argv: list[str]) -> int:
    keep, result = Path(argv[0]), json.loads(Path(argv[1]).read_text())
    logs = {n: log_times(keep / f"{n}.log") for n in ("a", "b") if (keep / f"{n}.log").exists()}
    probe, renew = events(keep / "probe.jsonl"), events(keep / "renew.jsonl")
    # each appliance's MAC: the source of the replies it sent while it was active
    macs = result.get("macs") or {}
    trials = result["trials"]["with_traffic"] + result["trials"]["under_flood"]
    rows = [timeline(t, logs, probe, renew, macs) for t in trials]
    print("kill  " + " ".join(f"{s:>12}" for s in STEPS))
    for i, row in enumerate(rows, 1):
        cells = ["-" if row[s] is None else f"{row[s]:.3f}" for s in STEPS]
        print(f"{i:>4}  " + " ".join(f"{c:>12}" for c in cells))
    medians = []
    for s in STEPS:
        values = [r[s] for r in rows if r[s] is not None]
        medians.append(f"{statistics.median(values):.3f}" if values else "-")
    print("med.  " + " ".join(f"{c:>12}" for c in medians))
    gaps = [(r["renewal_ack"] - r["vip"]) for r in rows if r["renewal_ack"] and r["vip"]]
    if gaps:
        print(f"renewal ACK after the VIP move: median {statistics.median(gaps):.3f} s, "
              f"max {max(gaps):.3f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
