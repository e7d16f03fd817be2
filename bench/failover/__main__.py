"""Failover gap of a rack: two appliances and a witness in network namespaces.

    flock /tmp/rackboot-bench.lock python -m bench.failover [--kills 20] [--quiet-kills 10]

With traffic: a probe does a full DORA every 50 ms (8 rotating MACs, relay
style, see probe.py); the active is killed (``kill -9``) ``--kills`` times,
each after a random wait so the kills fall at uniformly spread moments of
the renewal cycle; the gap is from the kill to the first OFFER carrying the
other appliance's server identifier. The killed node is restarted and given
a lease period to rejoin before the next kill (it is an acceptor too).

Without traffic: the probe is stopped, the active is killed ``--quiet-kills``
times, and the gap is from the kill to the standby reporting itself active
(its control socket, polled every 5 ms): nobody has to ask for it to take over.

Under a flood: ``--flood-kills`` more kills with traffic while a fifth
namespace floods the three election ports with junk (``--flood-rate``
datagrams/s from spoofed sources, tests/support/ha_flood.py), started a
second before each kill and lasting past the takeover.

Kea: the same kills against Kea 2.2's hot-standby pair with its most
aggressive timers, in the same namespaces and run (``--kea-kills``, see
kea.py); its default timers (a minute per kill) are quoted from the lab's
earlier measurement, not run.

Prints median, p99 (nearest rank), max, and writes bench/results/failover-*.json.
Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from appliance import control
from appliance.errors import RackbootError
from tests.support.dhcplab import wait_until
from tests.support.ha_lab import PORT, Rack
from tests.support.netns import Lab, need_root, probe_netns

RESULTS = Path(__file__).resolve().parents[1] / "results"
KEA_REFERENCE = {  # Kea 2.2 hot-standby, measured earlier in the lab: same probe shape, 11 kills
    "kea default timers": {"median": 63.97, "max": 69.97},
    "kea aggressive timers": {"median": 1.81, "max": 2.10},
}


def other(name: str) -> str:
    return "b" if name == "a" else "a"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "median": round(statistics.median(values), 4),
        "p99": round(percentile(values, 0.99), 4),
        "max": round(max(values), 4),
        "min": round(min(values), 4),
    }


def offers(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def settle(rack: Rack, timeout: float = 30.0) -> str:
    """Both appliances up, one active; returns the active's name."""
    wait_until(lambda: len(rack.actives()) == 1, timeout, "one active", detail=rack.logs)
    return rack.actives()[0]


def restart(rack: Rack, name: str, lease: float) -> None:
    rack.nodes[name].start(timeout=60)
    time.sleep(lease * 1.5)  # its acceptor's restart wait: it votes again after a lease


def kill_with_traffic(rack: Rack, events: Path, renew: float, lease: float, rng) -> float:
    active = settle(rack)
    new = other(active)
    new_id = rack.hosts[new].addr
    time.sleep(rng.uniform(0.5, 0.5 + 4 * renew))  # a random phase of the renewal cycle
    killed = time.monotonic()
    rack.nodes[active].kill9()

    def first_offer() -> float | None:
        for event in offers(events):
            if event["type"] == "offer" and event["server"] == new_id and event["t"] > killed:
                return event["t"]
        return None

    at = wait_until(first_offer, 15, f"an OFFER from {new}", detail=rack.logs)
    restart(rack, active, lease)
    return at - killed


def kill_quiet(rack: Rack, lease: float, rng) -> float:
    active = settle(rack)
    new = rack.nodes[other(active)]
    time.sleep(rng.uniform(0.5, 1.5))
    killed = time.monotonic()
    rack.nodes[active].kill9()
    deadline = killed + 15
    while time.monotonic() < deadline:
        try:
            if control.call(new.socket, "ha.status", timeout=1.0)["role"] == "active":
                gap = time.monotonic() - killed
                break
        except RackbootError:
            pass
        time.sleep(0.005)
    else:
        raise AssertionError(f"the standby did not take over without traffic\n{rack.logs()}")
    restart(rack, active, lease)
    return gap


def kill_under_flood(rack: Rack, attacker, ca: Path, rate: float, events: Path, renew: float,
                     lease: float, rng) -> float:  # fmt: skip
    targets = ",".join(f"{rack.hosts[n].addr}:{PORT}" for n in ("a", "b", "w"))
    flood = attacker.popen(
        [sys.executable, "-m", "tests.support.ha_flood", "--targets", targets, "--rate",
         str(rate), "--seconds", "6", "--ca", str(ca), "--spoof", str(rack.lab.network),
         "--seed", str(rng.randrange(1 << 30))],
        stdout=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    try:
        time.sleep(1.0)
        return kill_with_traffic(rack, events, renew, lease, rng)
    finally:
        flood.wait(timeout=60)


def run_kea(rack: Rack, lab: Lab, tmp: Path, kills: int, rng) -> list[float]:
    """The same kills against Kea's hot-standby pair, in the same namespaces."""
    if not kills:
        return []
    from bench.failover.kea import KeaPair, kill_trial

    events = tmp / "probe-kea.jsonl"
    probe = rack.client.popen(
        [sys.executable, "-m", "bench.failover.probe", rack.client.addr, str(events)],
        cwd=Path(__file__).resolve().parents[2],
    )
    standby = rack.hosts["b"].addr

    def first_offer_after(killed: float) -> float | None:
        for event in offers(events):
            if event["type"] == "offer" and event["server"] == standby and event["t"] > killed:
                return event["t"]
        return None

    gaps = []
    try:
        pair = KeaPair(rack.hosts, tmp, lab.network)
        for i in range(kills):
            gaps.append(kill_trial(pair, first_offer_after, rng))
            print(f"kea kill {i + 1}/{kills}: {gaps[-1]:.3f} s", flush=True)
    except Exception as exc:  # Kea is the reference: its failure must not lose our figures
        print(f"kea side stopped: {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
    finally:
        probe.terminate()
        probe.wait(timeout=10)
    return gaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover")
    parser.add_argument("--kills", type=int, default=20, help="kills with client traffic")
    parser.add_argument("--quiet-kills", type=int, default=10, help="kills without traffic")
    parser.add_argument("--flood-kills", type=int, default=10,
                        help="kills with traffic under a junk flood on the election ports")
    parser.add_argument("--flood-rate", type=float, default=6000.0,
                        help="junk datagrams per second over the three election ports")
    parser.add_argument("--kea-kills", type=int, default=11, help="Kea hot-standby kills (0: none)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the kill phases")
    args = parser.parse_args(argv)
    reason = need_root() or probe_netns()
    if reason:
        print(f"bench.failover: cannot run: {reason}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    lease, renew = 1.0, 0.25  # the [ha] defaults the rack runs with
    with Lab(prefix="rbf", lowlat=True) as lab, tempfile.TemporaryDirectory() as tmp:
        rack = Rack(lab, Path(tmp), client_addr=True)
        try:
            rack.start()
            events = Path(tmp) / "probe.jsonl"
            probe = rack.client.popen(
                [sys.executable, "-m", "bench.failover.probe", rack.client.addr, str(events)],
                cwd=Path(__file__).resolve().parents[2],
            )
            traffic = []
            for i in range(args.kills):
                traffic.append(kill_with_traffic(rack, events, renew, lease, rng))
                print(f"kill {i + 1}/{args.kills} with traffic: {traffic[-1]:.3f} s", flush=True)
            flooded = []
            attacker = lab.add_host("x") if args.flood_kills else None
            ca = next((Path(tmp) / "a").rglob("ca.crt"))
            for i in range(args.flood_kills):
                flooded.append(kill_under_flood(rack, attacker, ca, args.flood_rate, events,
                                                renew, lease, rng))  # fmt: skip
                print(f"kill {i + 1}/{args.flood_kills} under a flood: {flooded[-1]:.3f} s",
                      flush=True)  # fmt: skip
            probe.terminate()
            probe.wait(timeout=10)
            quiet = []
            for i in range(args.quiet_kills):
                quiet.append(kill_quiet(rack, lease, rng))
                print(f"kill {i + 1}/{args.quiet_kills} without traffic: {quiet[-1]:.3f} s",
                      flush=True)  # fmt: skip
        finally:
            rack.close()
        kea = run_kea(rack, lab, Path(tmp), args.kea_kills, rng)
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {"lease": lease, "renew": renew, "margin": 0.15, "probe_period": 0.05},
        "with_traffic_kill_to_first_offer_s": summary(traffic),
        "without_traffic_kill_to_active_s": summary(quiet) if quiet else None,
        "under_flood_kill_to_first_offer_s": summary(flooded) if flooded else None,
        "flood_rate": args.flood_rate,
        "raw": {"with_traffic": traffic, "without_traffic": quiet, "under_flood": flooded,
                "kea": kea},
        "kea_aggressive_kill_to_first_offer_s": summary(kea) if kea else None,
        "kea_reference_not_this_run": KEA_REFERENCE,
    }
    print()
    print(f"{'':38} {'n':>3} {'median':>8} {'p99':>8} {'max':>8} {'min':>8}")
    rows = (("rackboot, kill -> first OFFER", traffic),
            ("rackboot, no traffic, kill -> active", quiet),
            (f"rackboot, flood {args.flood_rate:.0f}/s, -> OFFER", flooded),
            ("kea aggressive, kill -> first OFFER", kea))  # fmt: skip
    for label, values in rows:
        if values:
            s = summary(values)
            print(f"{label:38} {s['n']:>3} {s['median']:>8.3f} {s['p99']:>8.3f} {s['max']:>8.3f} "
                  f"{s['min']:>8.3f}")  # fmt: skip
    median = summary(traffic)["median"]
    if kea:
        print(f"ratio of medians, kea aggressive / rackboot: {summary(kea)['median'] / median:.2f}")
    ref = KEA_REFERENCE["kea default timers"]
    print(
        f"kea default timers (lab, earlier run, not measured here): median {ref['median']} s, "
        f"max {ref['max']} s, never without client traffic"
    )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"failover-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwritten {path.relative_to(RESULTS.parent.parent)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
