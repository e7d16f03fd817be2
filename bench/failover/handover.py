"""A graceful hand-over against a kill -9 failover, same rack, same run.

    flock /tmp/rackboot-bench.lock python -m bench.failover.handover [--handovers 20] [--kills 5]

Two appliances and a witness in network namespaces (bench.failover's lab), a
relay-style DORA every 5 ms from the client's namespace (probe.py). Each
hand-over is `rackboot ha handover` through the control socket, on the active
and on the standby in turn (the standby asks the active), at a random moment of
the renewal cycle, once the standby counts again. Each kill is `kill -9` of the
active, which is then restarted. Two figures per trial: from the last OFFER of
the old active to the first of the new one (the service gap the clients see),
and from the request (or the kill) to that first OFFER. Prints median, p99
(nearest rank), max and min with the load average, and writes
bench/results/handover-*.json. Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from appliance import control
from bench.failover.__main__ import other, restart, settle, summary
from bench.results_file import save
from tests.support.dora_probe import DoraProbe, switch_gap
from tests.support.ha_lab import Rack
from tests.support.netns import Lab, need_root, probe_netns

PERIOD = 0.005  # s between the probe's DISCOVERs


def trial(rack: Rack, probe: DoraProbe, how: str, rng: random.Random) -> tuple[float, float]:
    """(gap between the two appliances' OFFERs, request to the new one's first OFFER)."""
    old = settle(rack)
    new = other(old)
    time.sleep(rng.uniform(0.5, 1.5))  # a random phase of the renewal cycle
    asked = time.monotonic()
    if how == "kill":
        rack.nodes[old].kill9()
    else:
        control.call(rack.nodes[old if how == "active" else new].socket, "ha.handover", {})
    deadline = asked + 10
    while not [t for t, who in probe.answers() if who == new and t > asked]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{new} never answered after the {how}:\n{rack.logs()}")
        time.sleep(0.05)
    time.sleep(0.1)
    offers = probe.answers()
    first = min(t for t, who in offers if who == new and t > asked)
    gap = switch_gap(offers, old, new, asked)
    if how == "kill":
        restart(rack, old, 1.0)
    return gap, first - asked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover.handover")
    parser.add_argument("--handovers", type=int, default=20)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default="", help="results file (default bench/results/)")
    args = parser.parse_args(argv)
    reason = need_root() or probe_netns()
    if reason:
        print(f"bench.failover.handover: cannot run: {reason}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    raw: dict[str, list[tuple[float, float]]] = {"active": [], "standby": [], "kill": []}
    load = os.getloadavg()
    with Lab(prefix="rbh", lowlat=True) as lab, tempfile.TemporaryDirectory() as tmp:
        rack = Rack(lab, Path(tmp), client_addr=True)
        try:
            rack.start()
            with DoraProbe(rack, Path(tmp) / "probe.jsonl", PERIOD) as probe:
                plan = ["active", "standby"] * (args.handovers // 2) + ["kill"] * args.kills
                for n, how in enumerate(plan):
                    raw[how].append(trial(rack, probe, how, rng))
                    gap, first = raw[how][-1]
                    print(f"{n + 1}/{len(plan)} {how}: gap {gap * 1000:.1f} ms, "
                          f"request -> OFFER {first * 1000:.1f} ms", flush=True)  # fmt: skip
        finally:
            rack.close()
    load = (load, os.getloadavg())
    handovers = raw["active"] + raw["standby"]
    rows = {
        "hand-over, OFFER gap": [g for g, _ in handovers],
        "hand-over, request -> OFFER": [f for _, f in handovers],
        "kill -9, OFFER gap": [g for g, _ in raw["kill"]],
        "kill -9, kill -> OFFER": [f for _, f in raw["kill"]],
    }
    print(f"\n{'':30} {'n':>3} {'median':>8} {'p99':>8} {'max':>8} {'min':>8}  (ms)")
    for label, values in rows.items():
        if values:
            s = summary(values)
            print(f"{label:30} {s['n']:>3} " + " ".join(
                f"{s[k] * 1000:>8.1f}" for k in ("median", "p99", "max", "min")))  # fmt: skip
    print(f"load average before {load[0][0]:.2f}, after {load[1][0]:.2f}")
    results = {label: summary(v) for label, v in rows.items() if v}
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    save("handover", stamp, args.json, vars(args),
         {"summary": results, "raw": raw, "load": load, "probe_period": PERIOD})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
