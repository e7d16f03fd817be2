"""Failover gap of a rack: two appliances and a witness in network namespaces.

    flock /tmp/rackboot-bench.lock python -m bench.failover [--kills 20] [--quiet-kills 10]

With traffic: a probe does a full DORA every 50 ms (8 rotating MACs, relay
style, see probe.py), and 4 clients in namespaces of their own renew their
leases through the VIP, one renewal every 25 ms in rotation (renew.py); the
active is killed (``kill -9``) ``--kills`` times, each after a random wait so
the kills fall at uniformly spread moments of the election's renewal cycle.
Both appliances answer with the VIP as server identifier and source address,
so the answering appliance is told by the reply's Ethernet source. Two gaps
per kill: from the kill to the first OFFER from the other appliance, and to
the first ACK it sends for a renewal (which also needs the new active's
first commit); a renewal NAKed, or ACKed with another address, is a failure
and reported. The killed node is restarted and given a lease period to
rejoin, and each kill waits until the standby counts again (docs/state.md:
only then may it take over).

Without traffic: the probes are stopped, the active is killed ``--quiet-kills``
times, and the gap is from the kill to the standby reporting itself active
(its control socket, polled every 5 ms): nobody has to ask for it to take over.

Under a flood: ``--flood-kills`` more kills with traffic while another
namespace floods the three election ports with junk (``--flood-rate``
datagrams/s from spoofed sources, tests/support/ha_flood.py), started a
second before each kill and lasting past the takeover.

Kea: the same kills against Kea 2.2's hot-standby pair with its most
aggressive timers, in the same namespaces and run (``--kea-kills``, see
kea.py), OFFER gap only (its servers have no VIP: a client renews at the dead
primary's own address until it rebinds at T2); its default timers (a minute
per kill) are quoted from the lab's earlier measurement, not run.

Prints median, p99 (nearest rank), max, and writes bench/results/failover-*.json;
``--keep DIR`` keeps the nodes' logs and the probes' events for
``python -m bench.failover.timeline``. Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from appliance import control
from appliance.errors import RackbootError
from tests.support.dhcplab import Timeout, wait_until
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


class Events:
    """The JSON lines a probe appends to ``path``, read incrementally (a poll reads only
    what was added since the last one)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.events: list[dict] = []

    def __call__(self) -> list[dict]:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            self.offset += len(data)
            lines = (self.partial + data).split(b"\n")
            self.partial = lines.pop()
            self.events += [json.loads(line) for line in lines if line.strip()]
        return self.events

    def since(self, t: float) -> list[dict]:
        """The events after ``t`` (one writer per file, which stamps them in order)."""
        events = self()
        return events[bisect.bisect_right(events, t, key=lambda e: e["t"]) :]


def settle(rack: Rack, timeout: float = 30.0) -> str:
    """One active whose standby follows it and counts (only then may the standby take
    over: docs/state.md); returns the active's name."""
    wait_until(rack.settled, timeout, "one active, its standby counted", detail=rack.logs)
    return rack.actives()[0]


def restart(rack: Rack, name: str, lease: float) -> None:
    rack.nodes[name].start(timeout=60)
    time.sleep(lease * 1.5)  # its acceptor's restart wait: it votes again after a lease


@dataclass
class Trial:
    """One kill with traffic, as the probes saw it (times from the kill, seconds)."""

    offer: float  # the first OFFER from the new active (the relay-style DORA probe)
    renewal: float | None  # the first ACK of a renewal from the new active; None: none
    arp: float | None  # the first renewal frame addressed to the new active's MAC
    last_renewal_before: float | None  # the last renewal sent before the kill, how long before
    lost: int  # renewals sent in the second before the kill never answered
    killed: float = 0.0  # CLOCK_MONOTONIC at the kill (the probes' clock)
    killed_wall: float = 0.0  # and the wall clock (the nodes' logs)
    dead: str = ""  # the appliance killed
    naks: list[dict] = field(default_factory=list)  # renewals NAKed after the kill
    moved: list[dict] = field(default_factory=list)  # renewal ACKs with another address

    def line(self) -> str:
        text = f"OFFER {self.offer:.3f} s"
        if self.renewal is not None or self.arp is not None:
            renewal = "none" if self.renewal is None else f"{self.renewal:.3f} s"
            arp = "never" if self.arp is None else f"{self.arp:.3f} s"
            text += (f", renewal ACK {renewal} (ARP to the new active {arp}, "
                     f"{self.lost} renewal(s) lost to the kill)")  # fmt: skip
        if self.naks or self.moved:
            text += f", FAILURES: {len(self.naks)} NAK(s), {len(self.moved)} moved"
        return text


def renewal_view(renewals: Events, killed: float, new_mac: str, wait: float) -> dict:
    """The renewing clients' view of one kill: wait (up to ``wait``) for a renewal ACKed by
    the new active, then read what happened to each renewal around the kill."""

    def first_ack() -> float | None:
        for event in renewals.since(killed):
            if event["type"] == "ack" and event["renewal"] and event["mac"] == new_mac:
                return event["t"]
        return None

    try:
        at = wait_until(first_ack, wait, "a renewal ACKed by the new active")
    except Timeout:
        at = None
    time.sleep(0.3)  # answers to renewals sent just before, NAKs included
    window = renewals.since(killed - 1.0)
    sent = {e["xid"]: e for e in window if e["type"] == "renew"}
    answered = {e["xid"] for e in window if e["type"] in ("ack", "nak") and e["renewal"]}
    before = [e for e in sent.values() if e["t"] <= killed]
    after = [e for e in window if e["t"] > killed]
    return {
        "renewal": None if at is None else at - killed,
        "arp": next(
            (e["t"] - killed for e in after if e["type"] == "wire" and e["dst_mac"] == new_mac),
            None,
        ),  # fmt: skip
        "last_renewal_before": killed - before[-1]["t"] if before else None,
        "lost": sum(1 for e in before if e["xid"] not in answered),
        "naks": [e for e in after if e["type"] == "nak" and e["renewal"]],
        "moved": [
            e
            for e in after
            if e["type"] == "ack"
            and e["renewal"]
            and e["xid"] in sent
            and e["yiaddr"] != sent[e["xid"]]["addr"]
        ],  # fmt: skip
    }


def kill_with_traffic(rack: Rack, probe: Events, renewals: Events | None, renew: float,
                      lease: float, rng) -> Trial:  # fmt: skip
    active = settle(rack)
    new = other(active)
    new_mac = rack.hosts[new].mac  # both answer with the VIP: the Ethernet source tells
    time.sleep(rng.uniform(0.5, 0.5 + 4 * renew))  # a random phase of the renewal cycle
    killed, killed_wall = time.monotonic(), time.time()
    rack.nodes[active].kill9()

    def first_offer() -> float | None:
        for event in probe.since(killed):
            if event["type"] == "offer" and event["mac"] == new_mac:
                return event["t"]
        return None

    at = wait_until(first_offer, 15, f"an OFFER from {new}", detail=rack.logs)
    view = {"renewal": None, "arp": None, "last_renewal_before": None, "lost": 0}
    if renewals is not None:
        view = renewal_view(renewals, killed, new_mac, 10.0)
    restart(rack, active, lease)
    return Trial(offer=at - killed, killed=killed, killed_wall=killed_wall, dead=active, **view)


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


def kill_under_flood(rack: Rack, attacker, ca: Path, rate: float, probe: Events,
                     renewals: Events | None, renew: float, lease: float, rng) -> Trial:  # fmt: skip
    targets = ",".join(f"{rack.hosts[n].addr}:{PORT}" for n in ("a", "b", "w"))
    flood = attacker.popen(
        [sys.executable, "-m", "tests.support.ha_flood", "--targets", targets, "--rate",
         str(rate), "--seconds", "6", "--ca", str(ca), "--spoof", str(rack.lab.network),
         "--seed", str(rng.randrange(1 << 30))],
        stdout=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    try:
        time.sleep(1.0)
        return kill_with_traffic(rack, probe, renewals, renew, lease, rng)
    finally:
        flood.wait(timeout=60)


def run_kea(rack: Rack, lab: Lab, tmp: Path, kills: int, rng) -> list[float]:
    """The same kills against Kea's hot-standby pair, in the same namespaces."""
    if not kills:
        return []
    from bench.failover.kea import KeaPair, kill_trial

    events = Events(tmp / "probe-kea.jsonl")
    probe = start_probe(rack, events.path)
    standby = rack.hosts["b"].mac

    def first_offer_after(killed: float) -> float | None:
        for event in events.since(killed):
            if event["type"] == "offer" and event["mac"] == standby:
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


ROOT = Path(__file__).resolve().parents[2]
RENEWERS = 4  # clients renewing in rotation (bench/failover/renew.py): one every 25 ms


def start_probe(rack: Rack, path: Path) -> subprocess.Popen:
    return rack.client.popen(
        [sys.executable, "-m", "bench.failover.probe", rack.client.addr, rack.client.ifname,
         str(path)], cwd=ROOT,
    )  # fmt: skip


def start_renewers(lab: Lab, path: Path, count: int) -> subprocess.Popen:
    """``count`` bare client namespaces with their own MACs, and the process renewing for
    them (it runs in this namespace and opens each client's sockets in the client's)."""
    specs = []
    for i in range(count):
        host = lab.add_host(f"r{i}", bare=True, mac=f"02:fb:00:00:00:{i:02x}")
        specs.append(f"{host.ns}:{host.ifname}:{host.mac}")
    return subprocess.Popen([sys.executable, "-m", "bench.failover.renew", str(path), *specs],
                            cwd=ROOT)  # fmt: skip


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=10)


def renewal_totals(renewals: Events, macs: dict[str, str]) -> dict:
    """Every renewal of the run: sent, answered by whom, NAKed, moved to another address."""
    events = renewals()
    sent = {e["xid"]: e for e in events if e["type"] == "renew"}
    acks = [e for e in events if e["type"] == "ack" and e["renewal"]]
    by_mac = {mac: name for name, mac in macs.items()}
    return {
        "sent": len(sent),
        "acked": len(acks),
        "acked_by": {name: sum(1 for e in acks if e["mac"] == mac) for name, mac in macs.items()},
        "acked_by_other": sum(1 for e in acks if e["mac"] not in by_mac),
        "naks": [e for e in events if e["type"] == "nak" and e["renewal"]],
        "moved": [e for e in acks if e["xid"] in sent and e["yiaddr"] != sent[e["xid"]]["addr"]],
        "send_errors": sum(1 for e in events if e["type"] == "send-error"),
    }


def keep_logs(rack: Rack, tmp: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for name, node in rack.nodes.items():
        if node.log.exists():
            (into / f"{name}.log").write_text(node.log.read_text(errors="replace"))
    if rack.witness_log.exists():
        (into / "w.log").write_text(rack.witness_log.read_text(errors="replace"))
    for path in tmp.glob("*.jsonl"):
        (into / path.name).write_bytes(path.read_bytes())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover")
    parser.add_argument("--kills", type=int, default=20, help="kills with client traffic")
    parser.add_argument("--quiet-kills", type=int, default=10, help="kills without traffic")
    parser.add_argument(
        "--flood-kills",
        type=int,
        default=10,
        help="kills with traffic under a junk flood on the election ports",
    )
    parser.add_argument(
        "--flood-rate",
        type=float,
        default=6000.0,
        help="junk datagrams per second over the three election ports",
    )
    parser.add_argument("--kea-kills", type=int, default=11, help="Kea hot-standby kills (0: none)")
    parser.add_argument(
        "--renewers",
        type=int,
        default=RENEWERS,
        help="clients renewing through the VIP in rotation (0: none)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seeds the kill phases")
    parser.add_argument("--keep", type=Path, help="copy the nodes' logs and probe events here")
    args = parser.parse_args(argv)
    reason = need_root() or probe_netns()
    if reason:
        print(f"bench.failover: cannot run: {reason}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    lease, renew = 1.0, 0.25  # the [ha] defaults the rack runs with
    traffic: list[Trial] = []
    flooded: list[Trial] = []
    quiet: list[float] = []
    totals = None
    macs: dict[str, str] = {}
    with Lab(prefix="rbf", lowlat=True) as lab, tempfile.TemporaryDirectory() as tmp:
        rack = Rack(lab, Path(tmp), client_addr=True)
        probe = renewer = None
        try:
            rack.start()
            macs = {n: rack.hosts[n].mac for n in ("a", "b")}
            events = Events(Path(tmp) / "probe.jsonl")
            probe = start_probe(rack, events.path)
            renewals = None
            if args.renewers:
                renewals = Events(Path(tmp) / "renew.jsonl")
                renewer = start_renewers(lab, renewals.path, args.renewers)
                wait_until(
                    lambda: len({e["client"] for e in renewals()
                                 if e["type"] == "ack" and e["renewal"]}) == args.renewers,
                    30, "every renewing client bound and renewing",
                )  # fmt: skip
            for i in range(args.kills):
                traffic.append(kill_with_traffic(rack, events, renewals, renew, lease, rng))
                print(f"kill {i + 1}/{args.kills} with traffic: {traffic[-1].line()}", flush=True)
            attacker = lab.add_host("x") if args.flood_kills else None
            ca = next((Path(tmp) / "a").rglob("ca.crt"))
            for i in range(args.flood_kills):
                flooded.append(kill_under_flood(rack, attacker, ca, args.flood_rate, events,
                                                renewals, renew, lease, rng))  # fmt: skip
                print(f"kill {i + 1}/{args.flood_kills} under a flood: {flooded[-1].line()}",
                      flush=True)  # fmt: skip
            stop(probe)
            stop(renewer)
            if renewals is not None:
                totals = renewal_totals(renewals, macs)
            quiet = []
            for i in range(args.quiet_kills):
                quiet.append(kill_quiet(rack, lease, rng))
                print(f"kill {i + 1}/{args.quiet_kills} without traffic: {quiet[-1]:.3f} s",
                      flush=True)  # fmt: skip
        finally:
            stop(probe)
            stop(renewer)
            rack.close()
            if args.keep:
                keep_logs(rack, Path(tmp), args.keep)
        kea = run_kea(rack, lab, Path(tmp), args.kea_kills, rng)
    offer_gaps = [t.offer for t in traffic]
    renewal_gaps = [t.renewal for t in traffic if t.renewal is not None]
    flood_offer = [t.offer for t in flooded]
    flood_renewal = [t.renewal for t in flooded if t.renewal is not None]
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {"lease": lease, "renew": renew, "margin": 0.15, "probe_period": 0.05,
                     "renewers": args.renewers, "renewal_period": 0.1},  # fmt: skip
        "with_traffic_kill_to_first_offer_s": summary(offer_gaps),
        "with_traffic_kill_to_first_renewal_ack_s": summary(renewal_gaps) if renewal_gaps else None,
        "renewals_without_ack_from_new_active": sum(1 for t in traffic + flooded
                                                    if args.renewers and t.renewal is None),
        "without_traffic_kill_to_active_s": summary(quiet) if quiet else None,
        "under_flood_kill_to_first_offer_s": summary(flood_offer) if flooded else None,
        "under_flood_kill_to_first_renewal_ack_s": summary(flood_renewal) if flood_renewal else None,
        "flood_rate": args.flood_rate,
        "renewal_totals": totals,
        "macs": macs,
        "trials": {"with_traffic": [asdict(t) for t in traffic],
                   "under_flood": [asdict(t) for t in flooded]},
        "raw": {"with_traffic": offer_gaps, "with_traffic_renewal": renewal_gaps,
                "without_traffic": quiet, "under_flood": flood_offer,
                "under_flood_renewal": flood_renewal, "kea": kea},
        "kea_aggressive_kill_to_first_offer_s": summary(kea) if kea else None,
        "kea_reference_not_this_run": KEA_REFERENCE,
    }  # fmt: skip
    print()
    print(f"{'':42} {'n':>3} {'median':>8} {'p99':>8} {'max':>8} {'min':>8}")
    rows = (("rackboot, kill -> first OFFER", offer_gaps),
            ("rackboot, kill -> first renewal ACK", renewal_gaps),
            ("rackboot, no traffic, kill -> active", quiet),
            (f"rackboot, flood {args.flood_rate:.0f}/s, -> OFFER", flood_offer),
            (f"rackboot, flood {args.flood_rate:.0f}/s, -> renewal ACK", flood_renewal),
            ("kea aggressive, kill -> first OFFER", kea))  # fmt: skip
    for label, values in rows:
        if values:
            s = summary(values)
            print(f"{label:42} {s['n']:>3} {s['median']:>8.3f} {s['p99']:>8.3f} {s['max']:>8.3f} "
                  f"{s['min']:>8.3f}")  # fmt: skip
    if totals is not None:
        failed = result["renewals_without_ack_from_new_active"]
        print(f"renewals: {totals['sent']} sent, {totals['acked']} ACKed "
              f"({', '.join(f'{k} {v}' for k, v in totals['acked_by'].items())}), "
              f"{len(totals['naks'])} NAKed, {len(totals['moved'])} ACKed with another address; "
              f"kills without a renewal ACKed by the new active: {failed}")  # fmt: skip
    median = summary(offer_gaps)["median"] if offer_gaps else None
    if kea and median:
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
