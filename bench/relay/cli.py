"""``python -m bench.relay``: perfdhcp's clients through Rackboot's relay and ISC dhcrelay.

One lab (bench/relay/lab.py): perfdhcp as directly attached clients on a client link,
the relay in a router namespace, Kea on the upstream link. For every offered rate the
two relays take turns (ABBA...), each run with a fresh Kea and a fresh relay; medians
per relay and the ratio Rackboot / dhcrelay. Method and figures: bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import results_file
from bench.dhcp import profile, system
from bench.dhcp.cli import Terminated, _children_cpu, _finish, _terminate, say
from bench.dhcp.perf import LOSS_LIMIT_PCT, parse_perfdhcp, perfdhcp_argv, report_sections
from bench.dhcp.search import median

REPO = Path(__file__).resolve().parents[2]
ALL_RELAYS = ("dhcrelay", "rackboot")
TARGET = 1.0  # Rackboot's achieved rate, at least this many times dhcrelay's
PERF_SLACK = 60.0  # perfdhcp gets duration + this before it is killed
CHECK_RATE, CHECK_SECONDS = 20, 2  # the wire check's perfdhcp run
PACKAGES = ["kea-dhcp4-server", "isc-dhcp-relay", "nftables"]  # + bench.dhcp's base


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.relay",
        description="perfdhcp (directly attached clients) through a DHCP relay to Kea: "
        "Rackboot's relay vs ISC dhcrelay, same lab, same server, same settings, alternating.",
    )
    p.add_argument(
        "--relays", default=",".join(ALL_RELAYS), help="comma-separated from dhcrelay, rackboot"
    )
    p.add_argument(
        "--rates",
        default="500,1500,2400,3000",
        help="offered DORA/s, comma-separated (default 500,1500,2400,3000)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per relay and rate (default 3)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per run, -p (default 10)")
    p.add_argument("--clients", type=int, default=50_000, help="simulated clients, -R")
    p.add_argument("--relay-cpu", default="0", help="taskset CPU list of the relay (default 0)")
    p.add_argument("--server-cpu", default="0", help="taskset CPU list of Kea (default 0)")
    p.add_argument("--client-cpu", default="1", help="taskset CPU list of perfdhcp (default 1)")
    p.add_argument(
        "--unicast",
        action="store_true",
        help="clients leave the broadcast flag off, so relays unicast replies to yiaddr at "
        "the client's MAC (both as frames through a packet socket; Rackboot's relay without "
        "CAP_NET_RAW sets an ARP entry per reply, see bench/README.md). Default: the flag "
        "set, replies broadcast on the client link",
    )
    p.add_argument(
        "--lowlat",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold /dev/cpu_dma_latency at 0 during the run (default on)",
    )
    p.add_argument(
        "--perfdhcp-arg", action="append", default=[], metavar="ARG", help="extra perfdhcp argument"
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 1 repeat of 3 s at 300/s")
    p.add_argument(
        "--profile",
        choices=("py-spy",),
        default=None,
        help="sample every Rackboot relay run with py-spy --native (files in bench/results/)",
    )
    p.add_argument("--json", nargs="?", const="", default=None, metavar="OUT", help="save results")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.duration, args.rates = 1, 3.0, "300"
    args.broadcast = not args.unicast
    args.relay_list = [r.strip() for r in args.relays.split(",") if r.strip()]
    unknown = [r for r in args.relay_list if r not in ALL_RELAYS]
    if unknown or not args.relay_list:
        p.error(f"--relays: unknown {unknown}; choose from {', '.join(ALL_RELAYS)}")
    try:
        args.rate_list = [int(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        p.error("--rates: a comma-separated list of integers")
    if not args.rate_list or min(args.rate_list) <= 0:
        p.error("--rates: rates must be positive")
    if args.repeats < 1 or args.duration <= 0 or args.clients < 1:
        p.error("--repeats, --duration and --clients must be positive")
    return args


@dataclass
class Run:
    """One perfdhcp run through one relay."""

    relay: str
    offered: int
    achieved: float = 0.0  # complete DORA/s (perfdhcp's Rate: line)
    loss_pct: float = 100.0  # 1 - ACKs / DISCOVERs
    do: dict[str, Any] = field(default_factory=dict)  # sent, received, drops_pct, delays (ms)
    ra: dict[str, Any] = field(default_factory=dict)
    relay_cpu_s: float | None = None  # the relay process, user + system, all threads
    relay_sys_s: float | None = None  # of which system (kernel) time
    kea_cpu_s: float | None = None
    perfdhcp_cpu_s: float | None = None
    others_cpu_pct: float = 0.0  # processes outside the lab, % of one CPU
    others: list[str] = field(default_factory=list)
    relay_stats: dict[str, Any] = field(default_factory=dict)  # its own counters
    error: str | None = None
    profile: str | None = None

    @property
    def done(self) -> int:
        return int(self.ra.get("received", 0))

    def cpu_pct(self, duration: float) -> float | None:
        return None if self.relay_cpu_s is None else 100.0 * self.relay_cpu_s / duration

    @property
    def sys_share(self) -> float | None:
        """Percent of the relay's CPU time spent in the kernel."""
        if not self.relay_cpu_s or self.relay_sys_s is None:
            return None
        return 100.0 * self.relay_sys_s / self.relay_cpu_s

    def us_per_dora(self, seconds: float | None) -> float | None:
        return None if seconds is None or self.done <= 0 else 1e6 * seconds / self.done

    def line(self, duration: float) -> str:
        if self.error:
            return f"{self.relay:<9} offered {self.offered:>5}/s  ERROR {self.error}"
        cpu = self.cpu_pct(duration)
        us = self.us_per_dora(self.relay_cpu_s)
        kea = self.us_per_dora(self.kea_cpu_s)
        stats = self.relay_stats
        counted = f"  fwd {stats.get('requests', '?')}/{stats.get('replies', '?')}" if stats else ""
        if stats.get("dropped"):
            counted += f" dropped {stats['dropped']}"
        for key in ("send_errors", "arp_refused"):
            if stats.get(key):
                counted += f" {key} {stats[key]}"
        busy = ""
        if self.others_cpu_pct >= 10.0:
            busy = f"  [others used {self.others_cpu_pct:.0f}% CPU: {', '.join(self.others)}]"
        return (
            f"{self.relay:<9} offered {self.offered:>5}/s  achieved {self.achieved:8.1f}/s  "
            f"DO {self.do.get('sent')}/{self.do.get('received')}  "
            f"RA {self.ra.get('sent')}/{self.ra.get('received')}  loss {self.loss_pct:5.2f}%  "
            f"delay DO {_ms(self.do.get('avg_ms'))} RA {_ms(self.ra.get('avg_ms'))} ms  "
            f"relay cpu {_num(cpu, '.0f')}% {_num(us, '.0f')} µs/DORA "
            f"(sys {_num(self.sys_share, '.0f')}%)  "
            f"kea {_num(kea, '.0f')} µs/DORA{counted}{busy}"
        )


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ms(value: float | None) -> str:
    return _num(value, ".2f")


def _exchange(values: dict[str, float]) -> dict[str, Any]:
    sent = int(values.get("sent packets", 0))
    drops = int(values.get("drops", 0))
    return {
        "sent": sent,
        "received": int(values.get("received packets", 0)),
        "drops": drops,
        "drops_pct": 100.0 * drops / sent if sent else None,
        "orphans": int(values.get("orphans", 0)),
        "min_ms": values.get("min delay"),
        "avg_ms": values.get("avg delay"),
        "max_ms": values.get("max delay"),
        "std_ms": values.get("std deviation"),
    }


class Bench:
    def __init__(self, args: argparse.Namespace, lab, workdir: Path, profile_dir: Path) -> None:
        from bench.relay import lab as labmod
        from bench.relay import wire

        self.args, self.lab, self.workdir, self.profile_dir = args, lab, workdir, profile_dir
        options = {"broadcast": args.broadcast}
        self.kea = labmod.UpstreamKea(workdir, lab.subnet, args.server_cpu, options)
        self.relays = {
            name: labmod.RELAYS[name](workdir, lab, args.relay_cpu, options)
            for name in args.relay_list
        }
        self.template_args = wire.perfdhcp_template_args(workdir, args.broadcast)

    def perfdhcp(self, rate: int, duration: float) -> list[str]:
        a = self.args
        argv = perfdhcp_argv(
            self.lab.cli.ifname,
            rate,
            a.clients,
            duration,
            extra=self.template_args + a.perfdhcp_arg,
        )
        return ["taskset", "-c", a.client_cpu, *argv]

    def start(self, relay) -> None:
        """A fresh Kea (empty lease file) and a fresh relay, a DORA through both."""
        self.kea.start(self.lab.srv, self.lab.cli)
        try:
            relay.start(self.lab.rly, self.lab.cli)
        except BaseException:
            self.kea.stop()
            raise

    def stop(self, relay) -> None:
        relay.stop()
        self.kea.stop()

    def wire_check(self, relay) -> tuple[bool, str]:
        """A short perfdhcp run with captures on both sides of the relay: the clients'
        requests carry giaddr 0 from port 68, the server's carry the relay's giaddr."""
        lab = self.lab
        self.start(relay)
        try:
            caps = {}
            for side, host in (("client", lab.down), ("upstream", lab.srv)):
                argv = [sys.executable, "-m", "bench.relay.wire", "capture", host.ifname,
                        str(CHECK_SECONDS + 2)]  # fmt: skip
                caps[side] = host.popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO,
                                        env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
            time.sleep(0.5)  # the capture sockets are bound
            res = lab.cli.run(self.perfdhcp(CHECK_RATE, CHECK_SECONDS), timeout=CHECK_SECONDS + 30)
            perf = parse_perfdhcp(
                res.stdout + res.stderr, CHECK_RATE, CHECK_SECONDS, res.returncode
            )
            seen = {}
            for side, proc in caps.items():
                out, _ = proc.communicate(timeout=CHECK_SECONDS + 20)
                seen[side] = [json.loads(line) for line in out.splitlines() if line.strip()]
        finally:
            self.stop(relay)
        return judge_wire(seen, lab, perf)

    def run(self, relay, rate: int) -> Run:
        a = self.args
        out = Run(relay.name, rate)
        try:
            self.start(relay)
        except Exception as exc:  # noqa: BLE001 - reported as this run's error
            out.error = str(getattr(exc, "summary", exc))
            return out
        spy = None
        try:
            others = system.OtherCPU(self.lab.namespaces)
            if a.profile and relay.profilable:
                out.profile = str(self.profile_dir / f"{relay.name}-{rate}-{relay.starts}.txt")
                spy = start_py_spy_native(relay.proc.pid, a.duration, Path(out.profile))
            others.start()
            relay.load_started()
            r0, k0, c0 = relay.cpu_seconds(), self.kea.cpu_seconds(), _children_cpu()
            s0 = relay.system_seconds()
            try:
                res = self.lab.cli.run(
                    self.perfdhcp(rate, a.duration), timeout=a.duration + PERF_SLACK
                )
                text, code = res.stdout + res.stderr, res.returncode
            except subprocess.TimeoutExpired as exc:
                text, code = f"{exc.stdout or ''}{exc.stderr or ''}", None
            r1, k1, c1 = relay.cpu_seconds(), self.kea.cpu_seconds(), _children_cpu()
            s1 = relay.system_seconds()
            out.others_cpu_pct, out.others = others.stop()
            perf = parse_perfdhcp(text, rate, a.duration, code)
            figures, _ = report_sections(text)
            out.achieved, out.loss_pct, out.error = perf.achieved, perf.loss_pct, perf.error
            out.do = _exchange(figures.get("DISCOVER-OFFER", {}))
            out.ra = _exchange(figures.get("REQUEST-ACK", {}))
            if r0 is not None and r1 is not None:
                out.relay_cpu_s = round(r1 - r0, 3)
            if s0 is not None and s1 is not None:
                out.relay_sys_s = round(s1 - s0, 3)
            if k0 is not None and k1 is not None:
                out.kea_cpu_s = round(k1 - k0, 3)
            out.perfdhcp_cpu_s = round(c1 - c0, 3)
            out.error = out.error or relay.exited() or self.kea.exited()
            if not out.error:
                out.relay_stats = relay.after_run(self.lab.rly)
            (relay.dir / "perfdhcp.last.txt").write_text(text)
        finally:
            if spy is not None:
                _finish(spy, 15.0)
            self.stop(relay)
        return out


def judge_wire(seen: dict[str, list[dict]], lab, perf) -> tuple[bool, str]:
    """The wire check's verdict and its one-line account."""
    client_req = [m for m in seen["client"] if m["op"] == 1 and m["src"].endswith(":68")]
    client_rep = [m for m in seen["client"] if m["op"] == 2 and m["dst"].endswith(":68")]
    up_req = [m for m in seen["upstream"] if m["op"] == 1 and m["dst"] == f"{lab.srv.addr}:67"]
    problems = []
    if not client_req:
        problems.append("no client request seen on the client link")
    if any(m["giaddr"] != "0.0.0.0" or m["hops"] != 0 for m in client_req):
        problems.append("perfdhcp's requests carry a giaddr or hops: they are not client-shaped")
    if not up_req:
        problems.append("nothing relayed to the server")
    wrong = [m for m in up_req if m["giaddr"] != lab.down.addr]
    if wrong:
        problems.append(f"{len(wrong)} relayed requests with giaddr {wrong[0]['giaddr']}")
    if any(m["option82"] for m in client_rep):
        problems.append("option 82 reached the client link (not stripped)")
    if perf.ra.received < perf.do.sent or perf.do.sent == 0:
        problems.append(f"perfdhcp completed {perf.ra.received} of {perf.do.sent} exchanges")
    flags = {m["flags"] for m in client_req}
    text = (
        f"client link: {len(client_req)} requests from {lab.cli.addr}:68 giaddr "
        f"{','.join(sorted({m['giaddr'] for m in client_req})) or '-'} hops "
        f"{','.join(sorted({str(m['hops']) for m in client_req})) or '-'} flags "
        f"{','.join(f'{f:#06x}' for f in sorted(flags)) or '-'}, {len(client_rep)} replies to port 68 "
        f"({sum(1 for m in client_rep if m['dst'].startswith('255.'))} broadcast, "
        f"{sum(1 for m in client_rep if m['option82'])} with option 82); upstream: "
        f"{len(up_req)} requests from {','.join(sorted({m['src'] for m in up_req})) or '-'} giaddr "
        f"{','.join(sorted({m['giaddr'] for m in up_req})) or '-'} hops "
        f"{','.join(sorted({str(m['hops']) for m in up_req})) or '-'}, option 82 in "
        f"{sum(1 for m in up_req if m['option82'])}; perfdhcp DO {perf.do.sent}/{perf.do.received} "
        f"RA {perf.ra.sent}/{perf.ra.received}"
    )
    if problems:
        return False, text + "  !!! " + "; ".join(problems)
    return True, text


def start_py_spy_native(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    """bench.dhcp's py-spy sampling, with native frames (C extensions, the interpreter's
    syscalls) so that time spent in socket calls shows where it is."""
    argv = [
        profile.py_spy_path() or "py-spy", "record", "--pid", str(pid), "--rate",
        str(profile.PY_SPY_RATE), "--duration", str(max(1, round(seconds))), "--format", "raw",
        "--threads", "--idle", "--native", "--output", str(out),
    ]  # fmt: skip
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def summary(runs: list[Run], args: argparse.Namespace) -> list[str]:
    """Medians per rate and relay, then Rackboot / dhcrelay."""
    lines = []
    head = (
        f"{'offered/s':>9} {'relay':<9} {'achieved/s':>10} {'loss %':>7} {'DO drop%':>8} "
        f"{'RA drop%':>8} {'DO avg/max ms':>14} {'RA avg/max ms':>14} {'relay cpu%':>10} "
        f"{'µs/DORA':>8} {'sys %':>6} {'kea µs':>7}  runs (achieved/s)"
    )
    lines.append(head)
    verdicts = []
    for rate in args.rate_list:
        med: dict[str, dict[str, float | None]] = {}
        for name in args.relay_list:
            mine = [r for r in runs if r.relay == name and r.offered == rate and not r.error]
            errors = [r for r in runs if r.relay == name and r.offered == rate and r.error]
            if not mine:
                why = errors[0].error if errors else "no run"
                lines.append(f"{rate:>9} {name:<9} no result: {why}")
                continue

            def m(values):
                values = [v for v in values if v is not None]
                return median(values) if values else None

            med[name] = {
                "achieved": m([r.achieved for r in mine]),
                "loss": m([r.loss_pct for r in mine]),
                "us": m([r.us_per_dora(r.relay_cpu_s) for r in mine]),
            }
            lines.append(
                f"{rate:>9} {name:<9} {med[name]['achieved']:>10,.1f} "
                f"{m([r.loss_pct for r in mine]):>7.2f} "
                f"{_num(m([r.do.get('drops_pct') for r in mine]), '.2f'):>8} "
                f"{_num(m([r.ra.get('drops_pct') for r in mine]), '.2f'):>8} "
                f"{_ms(m([r.do.get('avg_ms') for r in mine])) + '/' + _ms(m([r.do.get('max_ms') for r in mine])):>14} "
                f"{_ms(m([r.ra.get('avg_ms') for r in mine])) + '/' + _ms(m([r.ra.get('max_ms') for r in mine])):>14} "
                f"{_num(m([r.cpu_pct(args.duration) for r in mine]), '.0f'):>10} "
                f"{_num(med[name]['us'], '.0f'):>8} "
                f"{_num(m([r.sys_share for r in mine]), '.0f'):>6} "
                f"{_num(m([r.us_per_dora(r.kea_cpu_s) for r in mine]), '.0f'):>7}  "
                + ", ".join(f"{r.achieved:,.0f}" for r in mine)
                + (f"  ({len(errors)} failed)" if errors else "")
            )  # fmt: skip
        rb, isc = med.get("rackboot"), med.get("dhcrelay")
        if rb and isc and isc["achieved"]:
            ratio = rb["achieved"] / isc["achieved"]
            both = rb["loss"] < LOSS_LIMIT_PCT and isc["loss"] < LOSS_LIMIT_PCT
            cpu = (
                f"; relay CPU per DORA {rb['us']:.0f} vs {isc['us']:.0f} µs: "
                f"Rackboot needs {rb['us'] / isc['us']:.2f}x dhcrelay's"
                if rb["us"] and isc["us"]
                else ""
            )
            # Both sustained the offered rate: equal within perfdhcp's own jitter.
            verdict = (
                "MET: both sustained the offered rate"
                if both
                else "MET"
                if ratio >= TARGET
                else "NOT MET"
            )
            verdicts.append(
                f"at {rate}/s offered: rackboot {rb['achieved']:,.1f}/s vs dhcrelay "
                f"{isc['achieved']:,.1f}/s = {ratio:.3f}x (target >= {TARGET:g}x: {verdict}){cpu}"
            )
    shared = [r for r in runs if r.others_cpu_pct >= 10.0]
    notes = []
    if shared:
        worst = max(r.others_cpu_pct for r in shared)
        notes.append(
            f"note: other processes used >= 10 % of a CPU in {len(shared)} of {len(runs)} runs "
            f"(up to {worst:.0f} %): those figures may be low and noisy"
        )
    return lines + [""] + verdicts + notes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    reason = system.not_root_reason()
    if reason:
        print(reason.replace("bench.dhcp", "bench.relay"), file=sys.stderr)
        return 2
    ncpu = os.cpu_count() or 1
    for flag, cpus in (("--relay-cpu", args.relay_cpu), ("--server-cpu", args.server_cpu),
                       ("--client-cpu", args.client_cpu)):  # fmt: skip
        for part in cpus.replace("-", ",").split(","):
            if not part.isdigit() or int(part) >= ncpu:
                print(f"bench.relay: {flag} {cpus}: CPUs 0-{ncpu - 1} here", file=sys.stderr)
                return 2
    if args.profile and profile.py_spy_available():
        print(f"bench.relay: --profile: {profile.py_spy_available()}", file=sys.stderr)
        return 2
    system.ensure_packages([*system.BASE_PACKAGES, *PACKAGES], log=say)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.relay.lab import RelayLab
    from tests.support.netns import probe_netns

    why = probe_netns()
    if why:
        print(f"bench.relay: {why}", file=sys.stderr)
        return 2
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    workdir = Path(tempfile.mkdtemp(prefix="rackboot-bench-relay-"))
    profile_dir = results_file.RESULTS / f"relay-profile-{stamp}"
    if args.profile:
        profile_dir.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    checks: dict[str, str] = {}
    lab = None
    started = time.monotonic()
    try:
        with system.LowLatency(args.lowlat) as lowlat:
            lab = RelayLab()
            lab.steer_replies()
            bench = Bench(args, lab, workdir, profile_dir)
            env = system.environment(["kea"], lowlat.label)
            env["dhcrelay"] = system._first_line(["dhcrelay", "--version"])
            env["rackboot"] = tree_state()
            env["gc_thresh3"] = (
                Path("/proc/sys/net/ipv4/neigh/default/gc_thresh3").read_text().strip()
            )
            say(
                f"bench.relay {stamp}: perfdhcp -R {args.clients} as directly attached clients "
                f"through a relay to Kea; {args.repeats} x {args.duration:g} s per relay and rate, "
                f"relays alternating"
            )
            say("env: " + "  ".join(f"{k}={v}" for k, v in env.items()))
            say(
                f"lab: perfdhcp {lab.cli.addr} ({lab.cli.ifname}, taskset -c {args.client_cpu}) "
                f"-- client link {lab.subnet.network} -- relay {lab.down.addr} / {lab.rly.addr} "
                f"(taskset -c {args.relay_cpu}) -- upstream {lab.upstream.network} -- Kea "
                f"{lab.srv.addr} (taskset -c {args.server_cpu}), pool {lab.subnet.pool_start}-"
                f"{lab.subnet.pool_end}; replies {'broadcast' if args.broadcast else 'unicast'}; "
                f"work dir {workdir}"
            )
            say(
                "perfdhcp: "
                + " ".join(bench.perfdhcp(0, args.duration)[3:]).replace("-r 0", "-r RATE")
            )
            load, hogs = system.background_load(1.0)
            say(
                f"machine load before: {load:.0f} % of all CPUs busy"
                + (f" ({'; '.join(hogs)})" if hogs else "")
            )
            usable = []
            for name, relay in bench.relays.items():
                try:
                    ok, text = bench.wire_check(relay)
                except Exception as exc:  # noqa: BLE001 - the relay is reported unavailable
                    ok, text = False, f"not available: {getattr(exc, 'summary', exc)}"
                    tail = getattr(exc, "tail", "")
                    text += f"\n{tail}" if tail else ""
                checks[name] = text
                say(f"wire check {name}: {text}")
                if ok:
                    usable.append(name)
            for rate in args.rate_list:
                say(f"\n### {rate}/s offered")
                for i in range(args.repeats):
                    order = usable if i % 2 == 0 else list(reversed(usable))
                    for name in order:
                        run = bench.run(bench.relays[name], rate)
                        runs.append(run)
                        say(f"  {run.line(args.duration)}")
            total = time.monotonic() - started
            say(
                f"\n## medians, perfdhcp -R {args.clients}, {args.duration:g} s runs, {args.repeats} "
                f"per relay and rate; relay cpu {args.relay_cpu}, kea cpu {args.server_cpu}, "
                f"perfdhcp cpu {args.client_cpu}; lowlat {lowlat.label}"
            )
            for line in summary(runs, args):
                say(line)
            say(f"(total {total / 60:.1f} min)")
            if args.profile:
                say(profile_summary(runs, profile_dir))
            if args.json is not None:
                results_file.save("relay", stamp, args.json, {k: v for k, v in vars(args).items()},
                                  {"env": env, "wire_checks": checks,
                                   "runs": [asdict(r) for r in runs]})  # fmt: skip
    except (KeyboardInterrupt, Terminated) as exc:
        say(f"interrupted ({exc or 'SIGINT'}): stopping our processes, removing the lab")
        return 130
    finally:
        if lab is not None:
            lab.close()
        if args.keep:
            say(f"kept {workdir}")
        else:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    bad = [
        n
        for n in args.relay_list
        if n not in checks or "!!!" in checks[n] or "not available" in checks[n]
    ]
    return 1 if bad or any(r.error for r in runs) else 0


def tree_state() -> str:
    """The commit Rackboot runs from, and whether the relay's code differs from it (the
    working tree is shared: a run may measure edits not committed yet)."""

    def git(*argv: str) -> str:
        res = subprocess.run(["git", *argv], capture_output=True, text=True, cwd=REPO, timeout=30)
        return res.stdout.strip() if res.returncode == 0 else "?"

    head = git("rev-parse", "--short", "HEAD")
    dirty = git(
        "status", "--porcelain", "--", "plugins/relay", "plugins/dhcp/netio.py", "appliance"
    )
    return head + (
        " + uncommitted edits in "
        + ", ".join(sorted({ln.split(None, 1)[-1] for ln in dirty.splitlines()}))
        if dirty
        else ""
    )


def profile_summary(runs: list[Run], directory: Path) -> str:
    """Where the Rackboot relay's time went, over every profiled run."""
    files = [Path(r.profile) for r in runs if r.profile and Path(r.profile).exists()]
    if not files:
        return "\n## profile: no profile was written"
    stacks = at_waits(profile.read_collapsed(files))
    return (
        f"\n## rackboot relay profile (py-spy --native), {len(files)} run(s); files in {directory}\n"
        + profile.summarize_collapsed(stacks)
        + "\n"
        + by_function(stacks)
    )


def at_waits(stacks):
    """With --native a waiting thread's leaf is a libc frame (epoll_wait), not the Python
    frame bench.dhcp.profile recognises as a wait: cut each stack at its first wait frame."""
    from collections import Counter

    out = Counter()
    for stack, n in stacks.items():
        for i, frame in enumerate(stack[1:], start=1):
            if any(pattern.search(frame) for _, pattern in profile.WAITS):
                stack = stack[: i + 1]
                break
        out[stack] += n
    return out


def by_function(stacks, top: int = 20) -> str:
    """The main thread's busy samples by function, inclusive (a function counts once per
    sample however deep it recurs), in percent of those samples."""
    from collections import Counter

    waits = [pattern for _, pattern in profile.WAITS]
    busy = Counter()
    total = 0
    for stack, n in stacks.items():
        if stack[0] != "MainThread" or not stack[1:]:
            continue
        if any(p.search(stack[-1]) for p in waits):
            continue
        total += n
        for func in {re.sub(r":\d+\)$", ")", f) for f in stack[1:]}:
            busy[func] += n
    if not total:
        return "no busy main-thread samples"
    out = [f"main thread busy samples by function (inclusive), top {top}:"]
    out += [f"  {100.0 * n / total:5.1f}%  {f}" for f, n in busy.most_common(top)]
    return "\n".join(out)
