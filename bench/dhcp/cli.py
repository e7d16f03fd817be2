"""``python -m bench.dhcp``: perfdhcp DORA throughput of Kea, dnsmasq and Rackboot, side by side.

Every server runs in the same namespace lab (server host and client host on a
bridge), the server pinned to one vCPU, perfdhcp to the other, one server after
the other in the same run and under the same CPU latency setting. Method and
settings: bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.dhcp import profile, system
from bench.dhcp.perf import (
    LOSS_LIMIT_PCT,
    OTHERS_NOTE_PCT,
    PerfResult,
    parse_perfdhcp,
    perfdhcp_argv,
)
from bench.dhcp.search import RateSearch, confirm_candidates, median

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
ALL_SERVERS = ("kea", "dnsmasq", "dnsmasq-ping", "rackboot")
DEFAULT_SERVERS = ("kea", "dnsmasq", "rackboot")
HA_SERVERS = ("kea-ha", "rackboot-ha")  # --ha: Kea's hot-standby pair, a Rackboot rack
HA_TARGET = 2.0  # the rack's sustained rate, at least this many times the Kea pair's
PERF_SLACK = 60.0  # perfdhcp gets duration + this before it is killed
QUIET_RETRIES = 2  # with --wait-quiet: redo a run that shared the CPU, at most this often
BUSY_WARN_PCT = 10.0  # warn when others keep the machine this busy (% of all CPUs)
PROFILE_SLACK = 15.0  # py-spy gets duration + this to write its file


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.dhcp",
        description="DHCPv4 DORA throughput with perfdhcp: Kea vs dnsmasq vs Rackboot, "
        "same namespace lab, same CPU placement, one after the other.",
    )
    p.add_argument(
        "--ha",
        action="store_true",
        help="replicating pairs instead of single servers: Kea's hot-standby pair "
        "(libdhcp_ha.so + kea-ctrl-agent) vs a Rackboot rack (two appliances + witness, "
        "[ha] with a VIP, the state log replicated); every server process on --server-cpu; "
        "after each Rackboot run the standby's leases are checked against the active's",
    )
    p.add_argument(
        "--servers",
        default=None,
        help="comma-separated, in run order, from: kea, dnsmasq (with no-ping), dnsmasq-ping "
        "(as shipped: ping check before each offer), rackboot (default kea,dnsmasq,rackboot); "
        "with --ha from kea-ha, rackboot-ha (default both)",
    )
    p.add_argument("--repeats", type=int, default=None, help="confirmation runs (default 3)")
    p.add_argument(
        "--duration", type=float, default=None, help="seconds per perfdhcp run, -p (default 10)"
    )
    p.add_argument(
        "--rates",
        default="search",
        help="'search' (default: double from --start-rate until loss >= 1 %%, then bisect) "
        "or a comma-separated sweep list, e.g. 2000,4000,8000,12000",
    )
    p.add_argument("--start-rate", type=int, default=200, help="first rate of the search")
    p.add_argument(
        "--min-rate", type=int, default=10, help="the search gives up below this rate (default 10)"
    )
    p.add_argument("--max-rate", type=int, default=100_000, help="highest rate the search offers")
    p.add_argument(
        "--precision",
        type=float,
        default=None,
        help="stop bisecting when the bracket is within this share of the failing rate "
        "(default 0.05)",
    )
    p.add_argument(
        "--max-steps", type=int, default=None, help="screening runs per server (default 14)"
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds of screening per server before confirming what was found (default 240)",
    )
    p.add_argument("--clients", type=int, default=50_000, help="simulated clients, -R")
    p.add_argument(
        "--lowlat",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold /dev/cpu_dma_latency at 0 during the run (default on)",
    )
    p.add_argument("--server-cpu", default="0", help="taskset CPU list of the server (default 0)")
    p.add_argument("--client-cpu", default="1", help="taskset CPU list of perfdhcp (default 1)")
    p.add_argument(
        "--perfdhcp-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra perfdhcp argument (repeatable), e.g. --perfdhcp-arg=-g --perfdhcp-arg=single",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 repeat, 3 s runs, coarser search (explicit flags still win)",
    )
    p.add_argument(
        "--json",
        nargs="?",
        const="",
        default=None,
        metavar="OUT",
        help="save results as JSON; a bare file name goes to bench/results/ "
        "(default name dhcp-<time>.json)",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run, wait up to SECONDS for other processes to leave the machine "
        "< 10 %% busy (default 0: do not wait, only report)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    p.add_argument(
        "--profile",
        choices=("py-spy", "cprofile"),
        default=None,
        help="profile every Rackboot run: py-spy samples the running server from outside "
        "(pip install py-spy), cprofile runs it under python -m cProfile (slows it ~2x); "
        "files go to bench/results/, a summary is printed at the end",
    )
    args = p.parse_args(argv)

    quick = {"repeats": 1, "duration": 3.0, "precision": 0.10, "max_steps": 10, "budget": 90.0}
    full = {"repeats": 3, "duration": 10.0, "precision": 0.05, "max_steps": 14, "budget": 240.0}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    allowed = HA_SERVERS if args.ha else ALL_SERVERS
    if args.servers is None:
        args.servers = ",".join(HA_SERVERS if args.ha else DEFAULT_SERVERS)
    args.server_list = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [s for s in args.server_list if s not in allowed]
    if unknown or not args.server_list:
        p.error(
            f"--servers: unknown {unknown}; choose from {', '.join(allowed)}"
            + ("" if args.ha else " (kea-ha, rackboot-ha need --ha)")
        )
    if args.rates.strip() == "search":
        args.sweep = None
    else:
        try:
            args.sweep = sorted({int(r) for r in args.rates.split(",") if r.strip()})
        except ValueError:
            p.error("--rates: 'search' or a comma-separated list of integers")
        if not args.sweep or args.sweep[0] <= 0:
            p.error("--rates: rates must be positive")
    if args.repeats < 1 or args.duration <= 0 or args.clients < 1:
        p.error("--repeats, --duration and --clients must be positive")
    return args


@dataclass
class ServerReport:
    name: str
    status: str = "pending"  # ok | no-rate | unavailable | failed
    reason: str = ""
    sustained: int | None = None  # highest offered rate with median loss < 1 %
    achieved: float | None = None  # median achieved DORA/s at that rate
    loss: float | None = None  # median loss % at that rate
    ceiling_reached: bool = True  # False: passed even at --max-rate
    client_limited: bool = False  # perfdhcp sent clearly fewer than offered
    screening: list[dict[str, Any]] = field(default_factory=list)
    confirm: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    background_cpu_pct: float = 0.0  # CPU busy (all CPUs) with none of ours running
    background: list[str] = field(default_factory=list)  # the busiest other processes then
    log_tail: str = ""  # the server's last log lines when it was unavailable or failed


class Bench:
    def __init__(
        self, args: argparse.Namespace, lab, srv, cli, subnet, workdir: Path, profile_dir: Path
    ) -> None:
        self.args, self.lab, self.srv, self.cli = args, lab, srv, cli
        self.subnet, self.workdir, self.profile_dir = subnet, workdir, profile_dir
        self.waited = 0.0  # seconds spent waiting for a quiet machine (not budget)

    def run_once(self, server, rate: int) -> PerfResult:
        """One measured run; with --wait-quiet, runs shared with other processes are redone."""
        a = self.args
        for attempt in range(1 + QUIET_RETRIES):
            if a.wait_quiet > 0:
                self.waited += wait_until_quiet(a.wait_quiet)
            result = self._run(server, rate)
            if a.wait_quiet <= 0 or result.others_cpu_pct < OTHERS_NOTE_PCT:
                break
            if attempt < QUIET_RETRIES:
                say(f"  (shared)  {result.short()}: run again")
        return result

    def _run(self, server, rate: int) -> PerfResult:
        """Fresh server, one perfdhcp run at ``rate``, server stopped again."""
        a = self.args
        server.start(self.srv, self.cli)
        spies: list[tuple[str, Path, subprocess.Popen]] = []
        try:
            argv = perfdhcp_argv(self.cli.ifname, rate, a.clients, a.duration, extra=a.perfdhcp_arg)
            argv = ["taskset", "-c", a.client_cpu, *argv]
            others = system.OtherCPU(self.lab.namespaces)
            if a.profile == "py-spy" and server.profilable:
                for label, pid in server.profile_pids().items():
                    name = f"{server.name}-{label}" if label else server.name
                    spy_out = self.profile_dir / f"{name}-{rate}-{server.starts}.txt"
                    spies.append((label, spy_out, profile.start_py_spy(pid, a.duration, spy_out)))
            others.start()
            server.load_started()
            cpu0, child0 = server.cpu_seconds(), _children_cpu()
            try:
                res = self.cli.run(argv, timeout=a.duration + PERF_SLACK)
                out, code = res.stdout + res.stderr, res.returncode
            except subprocess.TimeoutExpired as exc:
                out, code = f"{exc.stdout or ''}{exc.stderr or ''}", None
            cpu1, child1 = server.cpu_seconds(), _children_cpu()
            result = parse_perfdhcp(out, rate, a.duration, code)
            result.others_cpu_pct, result.others = others.stop()
            if cpu0 is not None and cpu1 is not None:
                result.server_cpu_s = round(cpu1 - cpu0, 3)
            result.client_cpu_s = round(child1 - child0, 3)
            exited = server.exited()
            if exited and not result.error:
                result.error = exited
            elif not result.error:
                result.server_stats = server.after_run(self.srv)
            for label, spy_out, spy in spies:
                result.profiles[label] = str(spy_out)
                _finish(spy, PROFILE_SLACK)
            if spies:
                result.profile = str(spies[0][1])
            (server.dir / "perfdhcp.last.txt").write_text(out)
        finally:
            for _, _, spy in spies:
                if spy.poll() is None:
                    _finish(spy, 0)
            server.stop()  # cProfile writes its file as the node exits
        if a.profile == "cprofile" and server.name == "rackboot":  # cProfile: the single node
            pstats_file = server.pstats_path(server.starts)
            if pstats_file.exists():
                kept = self.profile_dir / f"{server.name}-{rate}-{server.starts}.pstats"
                shutil.move(pstats_file, kept)
                result.profile = str(kept)
        return result

    def bench(self, server) -> ServerReport:
        a = self.args
        rep = ServerReport(server.name)
        started = time.monotonic()
        self.waited = 0.0
        search = RateSearch(
            start=a.start_rate,
            min_rate=a.min_rate,
            max_rate=a.max_rate,
            precision=a.precision,
            max_steps=a.max_steps,
            sweep=a.sweep,
        )
        from bench.dhcp.servers import ServerUnavailable

        say(f"\n### {server.name}")
        rep.background_cpu_pct, hogs = system.background_load(1.0)
        if rep.background_cpu_pct >= BUSY_WARN_PCT:
            rep.background = hogs
            say(
                f"  WARNING: the machine is {rep.background_cpu_pct:.0f} % busy before we start "
                f"({'; '.join(hogs) or 'no single process'}): results will be low and noisy"
            )
        try:
            server.start(self.srv, self.cli)  # availability check before any load
            server.stop()
            while True:
                rate = search.next_rate()
                if rate is None:
                    break
                if time.monotonic() - started - self.waited > a.budget:
                    say(f"  screening budget of {a.budget:.0f} s used up: confirming what we have")
                    break
                res = self.run_once(server, rate)
                search.record(rate, res.sustained)
                rep.screening.append(res.to_json())
                self.flag(rep, res)
                say(f"  screen   {res.short()}")
            if search.best is not None and search.lowest_failure is None:
                rep.ceiling_reached = False
            for cand in confirm_candidates(search):
                runs = [self.run_once(server, cand) for _ in range(a.repeats)]
                for res in runs:
                    rep.confirm.append(res.to_json())
                    self.flag(rep, res)
                    say(f"  repeat   {res.short()}")
                mloss = median([r.loss_pct for r in runs])
                if mloss < LOSS_LIMIT_PCT:
                    rep.status = "ok"
                    rep.sustained = cand
                    rep.achieved = median([r.achieved for r in runs])
                    rep.loss = mloss
                    break
                say(f"  median loss {mloss:.2f} % at {cand}/s >= {LOSS_LIMIT_PCT} %: stepping down")
            else:
                rep.status = "no-rate"
                rep.reason = (
                    f"no offered rate kept loss < {LOSS_LIMIT_PCT} % (tried {sorted(search.tried)})"
                )
        except ServerUnavailable as exc:
            first = not rep.screening
            rep.status = "unavailable" if first else "failed"
            rep.reason = exc.summary + (f": {exc.last_log_line}" if exc.last_log_line else "")
            rep.log_tail = exc.tail
            say(f"  {server.name} {'not available' if first else 'failed'}: {exc}")
        finally:
            server.stop()
            rep.seconds = time.monotonic() - started
        return rep

    def flag(self, rep: ServerReport, res: PerfResult) -> None:
        expected = res.offered * res.duration
        if not res.error and res.do.sent < 0.95 * expected and res.loss_pct < LOSS_LIMIT_PCT:
            rep.client_limited = True


def _children_cpu() -> float:
    """CPU seconds of our reaped children so far (perfdhcp, once its run is waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _finish(proc: subprocess.Popen, timeout: float) -> None:
    """Wait for a helper we started (py-spy) up to ``timeout``, then stop it by its PID."""
    try:
        proc.wait(timeout=timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def wait_until_quiet(limit: float) -> float:
    """Wait (at most ``limit`` s) until other processes leave the machine < 10 % busy.

    Returns the seconds spent waiting.
    """
    start = time.monotonic()
    deadline = start + limit
    waited = False
    for _ in range(int(limit) + 2):
        share, hogs = system.background_load(1.0)
        if share < BUSY_WARN_PCT:
            if waited:
                say(f"  machine quiet again after {time.monotonic() - start:.0f} s")
            return time.monotonic() - start
        if time.monotonic() > deadline:
            say(f"  still {share:.0f} % busy after waiting {limit:.0f} s: running anyway")
            break
        if not waited:
            say(f"  waiting for a quiet machine ({share:.0f} % busy: {'; '.join(hogs) or '?'})")
            waited = True
    return time.monotonic() - start


def say(text: str) -> None:
    print(text, flush=True)


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def table(reports: list[ServerReport], args: argparse.Namespace) -> str:
    reference = "kea-ha" if args.ha else "kea"
    kea = next((r for r in reports if r.name == reference and r.status == "ok"), None)
    head = (
        f"{'server':<12} {'sustained offered/s':>20} {'median achieved/s':>18} "
        f"{'median loss':>11} {'vs Kea':>8} {'cpu µs/DORA':>12}  runs at that rate (loss %)"
    )
    if args.ha:
        head = head.replace("vs Kea", "vs pair").replace("server      ", "side        ")
    lines = [head, "-" * len(head)]
    for r in reports:
        if r.status != "ok":
            why = r.reason.splitlines()[0] if r.reason else r.status
            label = "not available" if r.status == "unavailable" else r.status
            lines.append(f"{r.name:<12} {label}: {why}")
            continue
        ratio = f"{r.sustained / kea.sustained:.3f}x" if kea and kea.sustained else "-"
        runs = [c for c in r.confirm if c["offered"] == r.sustained]
        losses = ", ".join(f"{c['loss_pct']:.2f}" for c in runs)
        sustained = fmt_rate(r.sustained) + ("" if r.ceiling_reached else "+")
        costs = [c["cpu_us_per_dora"] for c in runs if c.get("cpu_us_per_dora") is not None]
        cost = f"{median(costs):,.0f}" if costs else "-"
        lines.append(
            f"{r.name:<12} {sustained:>20} {r.achieved:>18,.1f} {r.loss:>10.2f}% {ratio:>8} "
            f"{cost:>12}  {losses}"
        )
    notes = []
    busy = []
    for r in reports:
        runs = r.screening + r.confirm
        worst = max((c.get("others_cpu_pct", 0.0) for c in runs), default=0.0)
        shared = sum(1 for c in runs if c.get("others_cpu_pct", 0.0) >= OTHERS_NOTE_PCT)
        if runs and (shared or r.background_cpu_pct >= BUSY_WARN_PCT):
            busy.append(f"{r.name} ({shared}/{len(runs)} runs, up to {worst:.0f} % of a CPU)")
    if busy:
        notes.append(
            "other processes used CPU during "
            + ", ".join(busy)
            + ": those figures may be low and noisy; re-run on a quiet machine (--wait-quiet)"
        )
    for r in reports:
        if r.status == "ok" and not r.ceiling_reached:
            top = max(c["offered"] for c in r.screening + r.confirm)
            notes.append(
                f"+ : {r.name} lost < 1 % at every rate tried, up to {top}/s; "
                "its ceiling is higher (raise --max-rate, --max-steps or --budget, or extend --rates)"
            )
    if any(r.status == "ok" for r in reports):
        notes.append(
            "cpu µs/DORA: the server's CPU time (all threads, user + system) over the run "
            "divided by the completed exchanges, median of the runs at that rate"
        )
    if any(r.client_limited for r in reports):
        limited = ", ".join(r.name for r in reports if r.client_limited)
        notes.append(
            f"perfdhcp sent < 95 % of the offered packets in some runs ({limited}): "
            "the client, not the server, may be the limit there"
        )
    return "\n".join(lines + [f"note: {n}" for n in notes])


def replication_problems(rep: ServerReport) -> list[str]:
    """The runs of a rack whose standby did not hold every lease the active committed."""
    out = []
    for run in rep.screening + rep.confirm:
        repl = (run.get("server_stats") or {}).get("replication")
        if repl is not None and not repl.get("ok"):
            out.append(f"{run['offered']}/s: {repl.get('problem')}")
    return out


def ha_summary(reports: list[ServerReport]) -> str:
    """--ha: the ratio against the target, CPU per exchange by process, the standby check."""
    by_name = {r.name: r for r in reports}
    kea, rack = by_name.get("kea-ha"), by_name.get("rackboot-ha")
    lines = ["", "## replicating pairs"]
    if kea and rack and kea.status == rack.status == "ok" and kea.sustained:
        ratio = rack.sustained / kea.sustained
        verdict = "MET" if ratio >= HA_TARGET else "NOT MET"
        lines.append(
            f"rackboot-ha {rack.sustained:,}/s vs kea-ha {kea.sustained:,}/s: {ratio:.2f}x "
            f"(target >= {HA_TARGET:g}x: {verdict})"
        )
    for r in (kea, rack):
        if r is None or r.status != "ok":
            continue
        runs = [c for c in r.confirm if c["offered"] == r.sustained]
        per: dict[str, list[float]] = {}
        sys_per: dict[str, list[float]] = {}
        for c in runs:
            done = c["ra"]["received"]
            stats = c.get("server_stats") or {}
            for key, into in (("cpu_s", per), ("sys_s", sys_per)):
                for name, seconds in stats.get(key, {}).items():
                    if seconds is not None and done > 0:
                        into.setdefault(name, []).append(1e6 * seconds / done)
        costs = [c["cpu_us_per_dora"] for c in runs if c.get("cpu_us_per_dora") is not None]
        if costs:
            parts = ", ".join(
                f"{n} {median(v):,.0f}"
                + (f" of which system {median(sys_per[n]):,.0f}" if sys_per.get(n) else "")
                for n, v in sorted(per.items())
            )
            lines.append(
                f"{r.name} server CPU per DORA at {r.sustained:,}/s: {median(costs):,.0f} µs "
                f"({parts})"
            )
    if rack is not None:
        runs = rack.screening + rack.confirm
        checked = [c for c in runs if (c.get("server_stats") or {}).get("replication")]
        bad = replication_problems(rack)
        if bad:
            reps = [c["server_stats"]["replication"] for c in checked]
            lost = sum(1 for r in reps if r.get("missing") or r.get("differ") or r.get("extra"))
            declared = sum(1 for r in reps if r.get("declared"))
            lines.append(
                f"!!! STANDBY MISMATCH in {len(bad)} of {len(checked)} rackboot-ha runs: "
                f"leases missing or different on the standby in {lost}, the standby declared "
                f"ineligible (the active committing without it) in {declared}; first: {bad[0]}"
            )
        elif checked:
            total = sum(c["server_stats"]["replication"]["active_leases"] for c in checked)
            lines.append(
                f"standby check: in all {len(checked)} rackboot-ha runs the standby held every "
                f"lease the active committed ({total:,} in all), and was never seen declared "
                "ineligible"
            )
        else:
            lines.append("standby check: no rackboot-ha run completed, nothing was checked")
    return "\n".join(lines)


def profile_report(reports: list[ServerReport], kind: str, directory: Path) -> str:
    """Where Rackboot's time went: the runs at its sustained rate, else every run."""
    rep = next((r for r in reports if r.name in ("rackboot", "rackboot-ha")), None)
    if rep is None:
        return ""
    runs = rep.screening + rep.confirm
    chosen = [c for c in rep.confirm if c["offered"] == rep.sustained] or runs
    by_label: dict[str, list[Path]] = {}
    for c in chosen:
        for label, path in (c.get("profiles") or {"": c.get("profile")}).items():
            if path:
                by_label.setdefault(label, []).append(Path(path))
    if not by_label:
        return f"\n## profile ({kind}): no profile was written"
    rates = sorted({c["offered"] for c in chosen})
    out = []
    for label, files in by_label.items():
        who = f"{rep.name} {label}" if label else rep.name
        head = (
            f"\n## {who} profile ({kind}), {len(files)} run(s) at "
            f"{', '.join(map(str, rates))}/s offered; files in {directory}"
        )
        if kind == "py-spy":
            body = profile.summarize_collapsed(profile.read_collapsed(files))
        else:
            body = profile.summarize_pstats(files)
        out.append(f"{head}\n{body}")
    return "\n".join(out)


def json_path(arg: str, stamp: str) -> Path:
    if not arg:
        return RESULTS / f"dhcp-{stamp}.json"
    path = Path(arg)
    return RESULTS / path if path.parent == Path(".") else path


class Terminated(Exception):
    """SIGTERM or SIGHUP: stop like Ctrl-C, tearing the lab down on the way out."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A background job may inherit SIGINT ignored; SIGTERM would skip the teardown.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    reason = system.not_root_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    ncpu = os.cpu_count() or 1
    for flag, cpus in (("--server-cpu", args.server_cpu), ("--client-cpu", args.client_cpu)):
        for part in cpus.replace("-", ",").split(","):
            if not part.isdigit() or int(part) >= ncpu:
                print(
                    f"bench.dhcp: {flag} {cpus}: this machine has CPUs 0-{ncpu - 1}",
                    file=sys.stderr,
                )
                return 2

    if args.profile is not None:
        if not {"rackboot", "rackboot-ha"} & set(args.server_list):
            print("bench.dhcp: --profile profiles Rackboot: add it to --servers", file=sys.stderr)
            return 2
        if args.ha and args.profile == "cprofile":
            print("bench.dhcp: --ha profiles with py-spy only (--profile py-spy)", file=sys.stderr)
            return 2
        why = profile.py_spy_available() if args.profile == "py-spy" else None
        if why:
            print(f"bench.dhcp: --profile py-spy: {why}", file=sys.stderr)
            return 2

    packages = list(system.BASE_PACKAGES)
    for name in args.server_list:
        packages += system.SERVER_PACKAGES[name]
    system.ensure_packages(packages, log=say)

    # The namespace lab of the project's real tests (imported late: needs the repo on sys.path).
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.dhcp.servers import SERVERS, Subnet
    from tests.support.netns import Lab, probe_netns

    why = probe_netns()
    if why:
        print(f"bench.dhcp: {why}", file=sys.stderr)
        return 2

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    workdir = Path(tempfile.mkdtemp(prefix="rackboot-bench-dhcp-"))
    profile_dir = RESULTS / f"profile-{stamp}"
    if args.profile is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    reports: list[ServerReport] = []
    started = time.monotonic()
    lab = None
    try:
        with system.LowLatency(args.lowlat) as lowlat:
            makers: dict[str, Any] = {}
            options: dict[str, Any] = {}
            if args.ha:
                from bench.dhcp.ha import BenchRack, KeaHA, RackHA, ha_lab

                lab, subnet = ha_lab()
                rack = BenchRack(lab, workdir / "rack", subnet)  # hosts a, b, w and c
                srv, cli = rack.hosts["a"], rack.client
                makers = {
                    "kea-ha": lambda: KeaHA(workdir, subnet, args.server_cpu, options, rack.hosts),
                    "rackboot-ha": lambda: RackHA(workdir, subnet, args.server_cpu, options, rack),
                }
            else:
                lab = Lab(prefix="rbb")
                subnet = Subnet.for_second_octet(lab.network.network_address.packed[1])
                srv = lab.add_host("srv", f"{subnet.server}/{subnet.network.prefixlen}")
                cli = lab.add_host("cli", f"{subnet.client}/{subnet.network.prefixlen}")
                makers = {
                    name: (lambda cls=cls: cls(workdir, subnet, args.server_cpu, options))
                    for name, cls in SERVERS.items()
                }
            env = system.environment(args.server_list, lowlat.label)
            settings = {
                "ha": args.ha,
                "servers": args.server_list,
                "repeats": args.repeats,
                "duration_s": args.duration,
                "clients": args.clients,
                "rates": args.sweep or "search",
                "start_rate": args.start_rate,
                "max_rate": args.max_rate,
                "precision": args.precision,
                "max_steps": args.max_steps,
                "budget_s": args.budget,
                "wait_quiet_s": args.wait_quiet,
                "min_rate": args.min_rate,
                "loss_limit_pct": LOSS_LIMIT_PCT,
                "server_cpu": args.server_cpu,
                "client_cpu": args.client_cpu,
                "perfdhcp_extra": args.perfdhcp_arg,
                "profile": args.profile,
                "subnet": str(subnet.network),
                "pool": f"{subnet.pool_start}-{subnet.pool_end}",
                "server_addr": subnet.server,
                "client_addr": subnet.client,
                "lab": {"server_ns": srv.ns, "server_if": srv.ifname,
                        "client_ns": cli.ns, "client_if": cli.ifname},
            }  # fmt: skip
            say(
                f"bench.dhcp {stamp}: perfdhcp full DORA, highest offered rate with "
                f"< {LOSS_LIMIT_PCT:g} % loss, median of {args.repeats} x {args.duration:g} s"
            )
            say("env: " + "  ".join(f"{k}={v}" for k, v in env.items()))
            if args.ha:
                settings["vip"] = rack.vip
                say(
                    f"lab: rack appliances a {rack.hosts['a'].addr}, b {rack.hosts['b'].addr} "
                    f"(VIP {rack.vip}), witness {rack.hosts['w'].addr}; the Kea pair on the "
                    f"same two hosts; every server process taskset -c {args.server_cpu}; "
                    f"perfdhcp {cli.addr} ({cli.ifname}, broadcast, taskset -c "
                    f"{args.client_cpu}), {args.clients} clients, pool {subnet.pool_start}-"
                    f"{subnet.pool_end} ({subnet.pool_size}), work dir {workdir}"
                )
            else:
                say(
                    f"lab: server {subnet.server} ({srv.ifname}, taskset -c {args.server_cpu}), "
                    f"perfdhcp {subnet.client} ({cli.ifname}, taskset -c {args.client_cpu}), "
                    f"{args.clients} clients, pool {subnet.pool_start}-{subnet.pool_end} "
                    f"({subnet.pool_size}), work dir {workdir}"
                )
            for name in args.server_list:
                server = makers[name]()
                bench = Bench(args, lab, srv, cli, subnet, workdir, profile_dir)
                reports.append(bench.bench(server))
            total = time.monotonic() - started
            say(
                f"\n## DHCP DORA/s, perfdhcp -R {args.clients}, {args.duration:g} s runs, "
                f"median of {args.repeats}, loss < {LOSS_LIMIT_PCT:g} %, "
                f"server cpu {args.server_cpu}, perfdhcp cpu {args.client_cpu}, "
                f"lowlat {lowlat.label}"
            )
            say(table(reports, args))
            if args.ha:
                say(ha_summary(reports))
            say(f"(total {total / 60:.1f} min)")
            if args.profile is not None:
                say(profile_report(reports, args.profile, profile_dir))
            if args.json is not None:
                path = json_path(args.json, stamp)
                path.parent.mkdir(parents=True, exist_ok=True)
                doc = {
                    "bench": "dhcp",
                    "time": stamp,
                    "env": env,
                    "settings": settings,
                    "total_s": round(total, 1),
                    "servers": [vars(r) for r in reports],
                }
                path.write_text(json.dumps(doc, indent=2) + "\n")
                say(f"results: {path}")
    except (KeyboardInterrupt, Terminated) as exc:
        say(f"interrupted ({exc or 'SIGINT'}): stopping our processes, removing the lab")
        return 130
    finally:
        if lab is not None:
            lab.close()
        if args.keep:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    ok = all(r.status in ("ok", "unavailable") for r in reports)
    return 0 if ok and not any(replication_problems(r) for r in reports) else 1
