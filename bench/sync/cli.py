"""``python -m bench.sync``: syncing a boot image and three edits of it, per system, same run.

The image (bench/sync/edits.py: seeded, 1 GiB by default, data + zeros + repeated
blocks + text) and its versions v1 (the base) -> v2 (1 MiB overwritten at the
middle + 36 KiB) -> v3 (1,000 bytes inserted at 66,000, ~64 KiB) -> v4 (20
scattered 4 KiB writes) are generated once per run in the bench's temp dir and
deleted at the end.

Scenarios, each bringing ``dst``'s copy (always the same file name) to a version:
``full`` (dst has nothing -> v1), ``overwrite`` (dst holds v1 -> v2), ``insert``
(v2 -> v3), ``scatter`` (v3 -> v4). A repeat runs them in that order, so each
scenario's basis is what the one before it left, checked byte for byte (SHA-256)
like every result; a scenario run alone gets its basis copied in first (untimed).

The lab: namespaces ``src1``, ``src2`` and ``dst`` on one bridge
(tests/support/netns.py). ``rsync``: ``rsync --daemon --no-detach`` in ``src1``
serving the versions as module ``images``; in ``dst``, ``rsync -a --stats
rsync://SRC1/images/vN/boot.img DIR/`` (``-a`` as an operator would type it: the
delta-transfer algorithm, no ``--whole-file``, no ``-z``). ``src2`` is for a
system that syncs from two peers at once (Rackboot's full sync, later).

Measured per run: wall seconds of the sync (start of the client to its exit);
**bytes on the wire** in both directions from ``dst``'s interface counters
(``/sys/class/net/IF/statistics/{rx,tx}_{bytes,packets}`` read inside the
namespace before and after: frames as the veth counts them, Ethernet + IP + TCP
headers included; with GRO/GSO a header per aggregate, not per 1500-byte frame,
and an IPv6 router solicitation or ARP in the window is counted too); and the
system's own figures (rsync's ``--stats``: literal data, matched data, bytes sent
and received); the busy seconds of the server's and the client's vCPUs during the
sync (``/proc/stat``, softirq included, steal not; anything else on those vCPUs
counts too: other processes' CPU over the whole run is reported) and their steal
time (the hypervisor running someone else: this VM's host is shared). The medians
of ``--repeats`` runs are reported.

dst's files: on **tmpfs** (``/dev/shm``) by default, ``--dst-on disk`` puts them in
the temp dir on disk. On disk (ext4 here) a delta run's timing is mostly the VM's
virtual disk: rsync writes the new version to a temporary file and renames it over
the old one, which makes ext4 start writing it out at once (``auto_da_alloc``), and
runs then wait on I/O for seconds that vary with the host. The sources' versions
stay on disk (read from the page cache).

Page cache: **not dropped**, on either side, for every system alike. The versions
are in the cache from their generation (24 GB of RAM here) and stay there, so a
run reads its source and basis from memory; dropping the cache on a shared VM
would also disturb everyone else's measurements. Before every timed run
``sync(2)`` flushes the earlier runs' dirty pages, so their writeback does not fall
in the window; a run's own writes are not flushed inside it (rsync does not
fsync without ``--fsync``). A warm-up pass of every scenario per system comes first,
unmeasured (``--no-warmup`` to skip): without it the first full sync of a run was
1.1-3 s slower than the next ones in all four runs that had none (cause not
investigated).

Adding a system (Rackboot's sync, issue 17): a function ``name(ctx: Context) ->
System`` in :data:`SYSTEMS`, started once per run after the lab exists; its
``prepare(step)`` (untimed) puts ``dst`` in the step's basis state, ``sync(step)``
(timed, wire counted) brings ``dst`` to ``step.version`` and returns its own
figures, ``result(step)`` names the file to check. See :class:`System`.
``--systems rsync,rackboot`` adds Rackboot's (bench/sync/rackboot.py, imported
only when selected); the default is rsync alone. The systems' order flips every
repeat; each prints its ratio to rsync's medians.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from bench import results_file
from bench.dhcp.cli import wait_until_quiet
from bench.dhcp.system import OtherCPU, cpu_model, missing_packages
from bench.sync import edits
from bench.tftp.servers import apt

PACKAGES = ["rsync", "util-linux", "iproute2"]
MIB = 1 << 20
FILE = "boot.img"  # dst's copy keeps this name across versions: rsync's basis
MODULE = "images"
RSYNC_PORT = 873
RSYNC_OPTIONS = ["-a", "--stats"]
# scenario: (the version dst is brought to, the version it holds before; None: nothing)
SCENARIOS: dict[str, tuple[str, str | None]] = {
    "full": ("v1", None),
    "overwrite": ("v2", "v1"),
    "insert": ("v3", "v2"),
    "scatter": ("v4", "v3"),
}
DST_ON = {
    "tmpfs": "tmpfs (/dev/shm: the sync, not the VM's virtual disk)",
    "disk": "disk (ext4 under the temp dir: writeback and rename-over flushes included)",
}
PAGE_CACHE = "not dropped (warm, both sides); sync(2) before each timed run"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.sync", description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=1024, help="base image size (1024)")
    p.add_argument("--repeats", type=int, default=3, help="runs per system and scenario (3)")
    p.add_argument("--quick", action="store_true", help="a smoke run: --size-mib 64 --repeats 1")
    p.add_argument("--systems", default="rsync", help=f"which, of {','.join(SYSTEMS)} (rsync)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="which, run in this order")
    p.add_argument("--seed", type=int, default=edits.DEFAULT_SEED, help="image and edit seed (17)")
    p.add_argument("--server-cpu", default="0", help="taskset CPU list of the sources (0)")
    p.add_argument("--client-cpu", default="1", help="taskset CPU list of dst's side (1)")
    p.add_argument("--dst-on", choices=["tmpfs", "disk"], default="tmpfs",
                   help="dst's files on /dev/shm (default) or in the temp dir on disk")  # fmt: skip
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="one unmeasured pass of the scenarios per system first (default on)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one sync may take")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="before each sync, wait up to SECONDS for others to leave the CPUs idle")  # fmt: skip
    p.add_argument("--json", default="", metavar="PATH",
                   help="results file (default bench/results/sync-STAMP.json)")  # fmt: skip
    args = p.parse_args(argv)
    if args.quick:
        args.size_mib, args.repeats = 64, 1
    return args


# -- what a system is given and gives back -------------------------------------


@dataclass
class Context:
    """The lab and the files, for every system of a run."""

    lab: Any  # tests.support.netns.Lab
    src1: Any  # Host: rsync's daemon; Rackboot's first peer
    src2: Any  # Host: Rackboot's second peer (two-peer full sync)
    dst: Any  # Host: the appliance being brought up to date
    work: Path  # the run's temp dir (a system may make its own subdirectory)
    dst_root: Path  # where dst's files go, per --dst-on (a subdirectory per system)
    versions: dict[str, edits.Version]  # v1..v4, each at work/versions/vN/boot.img
    server_cpu: str  # taskset CPU list for whatever serves (src1, src2)
    client_cpu: str  # taskset CPU list for dst's side
    timeout: float  # seconds one sync may take


@dataclass(frozen=True)
class Step:
    """One timed sync: bring dst's copy of the image to ``version`` from ``basis``."""

    scenario: str  # full | overwrite | insert | scatter
    version: str  # v1..v4: what dst must hold afterwards
    basis: str | None  # what dst holds before (None: nothing at all)


class System(Protocol):
    """A sync implementation under test; made by a ``SYSTEMS`` factory per run."""

    name: str
    description: str  # what runs, with its options: printed and saved

    def prepare(self, step: Step) -> None:
        """Untimed: put dst in ``step.basis``'s state (nothing, or that version)."""

    def sync(self, step: Step) -> dict:
        """Timed, wire counted: bring dst to ``step.version``; the system's own figures."""

    def result(self, step: Step) -> Path:
        """The file holding dst's copy after :meth:`sync` (checked against the version)."""


# -- rsync -------------------------------------------------------------------


class Rsync:
    """``rsync --daemon`` in src1, ``rsync -a --stats`` pulling into dst."""

    name = "rsync"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.dir = ctx.dst_root / "rsync"
        self.dir.mkdir(mode=0o755)
        self.holds: str | None = None  # the version dst's copy is known to be
        root = ctx.versions["v1"].path.parent.parent
        conf = ctx.work / "rsyncd.conf"
        self._stderr = (ctx.work / "rsyncd.stderr").open("w")
        conf.write_text(
            f"pid file = {ctx.work}/rsyncd.pid\nlock file = {ctx.work}/rsyncd.lock\n"
            f"log file = {ctx.work}/rsyncd.log\nport = {RSYNC_PORT}\n"
            f"address = {ctx.src1.addr}\nuse chroot = no\ntransfer logging = no\n"
            f"[{MODULE}]\n    path = {root}\n    read only = yes\n"
            "    uid = root\n    gid = root\n"
        )
        self.proc = ctx.src1.popen(
            ["taskset", "-c", ctx.server_cpu, "rsync", "--daemon", "--no-detach",
             f"--config={conf}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
        )  # fmt: skip
        self.url = f"rsync://{ctx.src1.addr}/{MODULE}"
        for _ in range(200):  # 10 s at most
            if self.proc.poll() is not None:
                tail = (ctx.work / "rsyncd.stderr").read_text()[-500:]
                raise RuntimeError(f"rsync --daemon exited: {tail!r}")
            if ctx.dst.run(["rsync", f"rsync://{ctx.src1.addr}/"], timeout=10).returncode == 0:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("rsync --daemon did not answer")
        version = subprocess.run(["rsync", "--version"], capture_output=True, text=True).stdout
        self.version = version.splitlines()[0].strip() if version else "?"
        self.description = (
            f"{self.version}; daemon in src1 (taskset -c {ctx.server_cpu}), "
            f"client in dst (taskset -c {ctx.client_cpu}): "
            f"rsync {' '.join(RSYNC_OPTIONS)} {self.url}/vN/{FILE} DIR/ "
            "(delta-transfer, no --whole-file, no -z)"
        )

    def prepare(self, step: Step) -> None:
        for entry in self.dir.iterdir():  # an earlier failure's temporary files
            if entry.name != FILE:
                entry.unlink()
        dest = self.dir / FILE
        if step.basis is None:
            dest.unlink(missing_ok=True)
        elif self.holds != step.basis or not dest.exists():
            shutil.copy2(self.ctx.versions[step.basis].path, dest)
        self.holds = step.basis

    def sync(self, step: Step) -> dict:
        self.holds = None
        argv = ["taskset", "-c", self.ctx.client_cpu, "rsync", *RSYNC_OPTIONS,
                f"{self.url}/{step.version}/{FILE}", f"{self.dir}/"]  # fmt: skip
        proc = self.ctx.dst.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=self.ctx.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)
            raise RuntimeError(f"rsync took longer than {self.ctx.timeout} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"rsync exited {proc.returncode}: {err[-500:]}")
        self.holds = step.version
        return parse_stats(out)

    def result(self, step: Step) -> Path:
        return self.dir / FILE


STATS_KEYS = {
    "Literal data": "literal_data",
    "Matched data": "matched_data",
    "Total bytes sent": "bytes_sent",
    "Total bytes received": "bytes_received",
    "File list size": "file_list_size",
    "Total transferred file size": "transferred_file_size",
}


def parse_stats(text: str) -> dict:
    """rsync's ``--stats`` figures (client's view: sent = to the daemon)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in STATS_KEYS:
            match = re.match(r"\s*([\d,]+)", value)
            if match:
                out[STATS_KEYS[key.strip()]] = int(match.group(1).replace(",", ""))
    missing = set(STATS_KEYS.values()) - set(out)
    if missing:
        raise RuntimeError(f"rsync --stats without {sorted(missing)}: {text[-500:]!r}")
    return out


def rackboot(ctx: Context) -> System:
    """Rackboot's images sync (bench/sync/rackboot.py), imported only when selected."""
    from bench.sync.rackboot import Rackboot

    return Rackboot(ctx)


SYSTEMS: dict[str, Callable[[Context], System]] = {"rsync": Rsync, "rackboot": rackboot}


# -- measuring ---------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    rx: int  # bytes dst's interface received
    tx: int  # bytes it sent
    rx_packets: int
    tx_packets: int
    server_vcpu_s: float  # busy seconds of --server-cpu's vCPUs meanwhile (softirq included)
    client_vcpu_s: float  # and of --client-cpu's
    steal_s: float  # both vCPUs' steal time meanwhile: the host gave them to someone else
    others_pct: float  # CPU used by processes outside the lab meanwhile, % of one CPU
    figures: dict = field(default_factory=dict)  # the system's own

    @property
    def wire(self) -> int:
        return self.rx + self.tx


def counters(host) -> tuple[int, int, int, int]:
    """(rx bytes, tx bytes, rx packets, tx packets) of ``host``'s lab interface."""
    base = f"/sys/class/net/{host.ifname}/statistics"
    names = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")
    res = host.run(["cat", *(f"{base}/{n}" for n in names)], check=True, timeout=10)
    values = [int(x) for x in res.stdout.split()]
    return values[0], values[1], values[2], values[3]


def cpu_seconds(cpulist: str) -> tuple[float, float]:
    """(busy, steal) seconds so far of the CPUs in a taskset list like '0' or '0,1'.

    busy: everything but idle, iowait and steal (softirq included: the packets' path
    through veth and bridge is charged to no process). steal: time the hypervisor
    ran something else while this vCPU wanted to run (a shared host's contention).
    """
    wanted = {f"cpu{c}" for c in cpulist.split(",")}
    busy = steal = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name in wanted:
            v = [int(x) for x in values]
            busy += sum(v[:8]) - v[3] - v[4] - v[7]  # guest time is already in user
            steal += v[7]
    hz = os.sysconf("SC_CLK_TCK")
    return busy / hz, steal / hz


def measure(ctx: Context, system: System, step: Step, wait_quiet: float = 0.0) -> Run:
    system.prepare(step)
    os.sync()
    if wait_quiet > 0:
        wait_until_quiet(wait_quiet)
    before = counters(ctx.dst)
    others = OtherCPU(ctx.lab.namespaces)
    others.start()
    busy0 = (*cpu_seconds(ctx.server_cpu), *cpu_seconds(ctx.client_cpu))
    t0 = time.monotonic()
    figures = system.sync(step)
    seconds = time.monotonic() - t0
    busy1 = (*cpu_seconds(ctx.server_cpu), *cpu_seconds(ctx.client_cpu))
    others_pct, _ = others.stop()
    after = counters(ctx.dst)
    rx, tx, rxp, txp = (b - a for a, b in zip(before, after, strict=True))
    got = edits.sha256_file(system.result(step))
    if got != ctx.versions[step.version].sha256:
        raise RuntimeError(f"{system.name} {step.scenario}: dst's copy differs from {step.version}")
    server, server_steal, client, client_steal = (b - a for a, b in zip(busy0, busy1, strict=True))
    steal = server_steal + client_steal
    return Run(seconds, rx, tx, rxp, txp, server, client, steal, others_pct, figures)


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.sync must run as root (namespaces, apt-get)", file=sys.stderr)
        return 2
    systems = [s for s in args.systems.split(",") if s]
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = (set(systems) - set(SYSTEMS)) | (set(scenarios) - set(SCENARIOS))
    if unknown or not systems or not scenarios:
        print(f"unknown or no systems/scenarios: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    missing = missing_packages(PACKAGES)
    if missing and apt("install", "-y", "--no-install-recommends", *missing).returncode != 0:
        apt("update")
        apt("install", "-y", "--no-install-recommends", *missing)
    still = missing_packages(PACKAGES)
    if still:
        print(f"bench.sync: cannot install {' '.join(still)}", file=sys.stderr)
        return 2
    from tests.support.netns import Lab

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    size = args.size_mib * MIB
    work = Path(tempfile.mkdtemp(prefix="rackboot-bench-sync-"))
    os.chmod(work, 0o755)
    if args.dst_on == "tmpfs":
        dst_root = Path(tempfile.mkdtemp(prefix="rackboot-bench-sync-", dir="/dev/shm"))
    else:
        dst_root = work / "dst"
        dst_root.mkdir()
    os.chmod(dst_root, 0o755)
    runs: dict[str, dict[str, list[Run]]] = {s: {n: [] for n in systems} for s in scenarios}
    try:
        t0 = time.monotonic()
        versions = edits.build_versions(work / "versions", size, args.seed, FILE)
        made = time.monotonic() - t0
        with Lab(prefix="rbs") as lab:
            src1, src2, dst = lab.add_host("src1"), lab.add_host("src2"), lab.add_host("dst")
            ctx = Context(lab, src1, src2, dst, work, dst_root, versions, args.server_cpu,
                          args.client_cpu, args.timeout)  # fmt: skip
            started = {name: SYSTEMS[name](ctx) for name in systems}
            shares = edits.composition(args.seed, size)
            print(f"bench.sync {stamp}: {args.size_mib} MiB image (seed {args.seed}: "
                  + ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if k != "segments")
                  + f"; {shares['segments']} segments; v1..v4 made in {made:.1f} s), "
                  f"median of {args.repeats}")  # fmt: skip
            print(f"env: cpu={cpu_model()} vcpus={os.cpu_count()} kernel={platform.release()} "
                  f"python={sys.version.split()[0]} page cache {PAGE_CACHE}; "
                  f"dst's files on {DST_ON[args.dst_on]}; "
                  f"wire = dst's interface counters ({dst.ifname}), rx + tx")  # fmt: skip
            for system in started.values():
                print(f"{system.name}: {system.description}")
            if args.warmup:  # unmeasured (but checked): first-run costs out of the figures
                t0 = time.monotonic()
                for name in systems:
                    for scenario in scenarios:
                        measure(ctx, started[name], Step(scenario, *SCENARIOS[scenario]))
                print(f"warm-up: one unmeasured pass per system, {time.monotonic() - t0:.1f} s")
            load = [load_average()]
            others = OtherCPU(lab.namespaces)
            others.start()
            for i in range(args.repeats):
                order = systems if i % 2 == 0 else systems[::-1]
                for name in order:
                    for scenario in scenarios:
                        version, basis = SCENARIOS[scenario]
                        step = Step(scenario, version, basis)
                        run = measure(ctx, started[name], step, args.wait_quiet)
                        runs[scenario][name].append(run)
                        print(f"  repeat {i + 1} {name:8} {scenario:9} {run.seconds:7.2f} s  "
                              f"wire {run.wire:>13,} B (rx {run.rx:,}, tx {run.tx:,})  "
                              f"vCPU busy s: server {run.server_vcpu_s:.2f}, "
                              f"client {run.client_vcpu_s:.2f}, steal {run.steal_s:.2f}; "
                              f"others {run.others_pct:.0f}% of a CPU",
                              flush=True)  # fmt: skip
            busy, hogs = others.stop()
            load.append(load_average())
            descriptions = {name: s.description for name, s in started.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(dst_root, ignore_errors=True)
    results = {
        "environment": {
            "cpu": cpu_model(),
            "vcpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": sys.version.split()[0],
            "page_cache": PAGE_CACHE,
            "dst_on": DST_ON[args.dst_on],
            "systems": descriptions,
            "load_average_before_after": load,
            "others_cpu_pct": busy,
            "others": hogs,
        },
        "image": {
            "size": size,
            "seed": args.seed,
            "composition": shares,
            "versions": {
                n: {"edit": v.edit, "size": v.size, "sha256": v.sha256, "ranges": v.ranges}
                for n, v in versions.items()
            },
        },
        "scenarios": {s: report(s, SCENARIOS[s], runs[s], size) for s in scenarios},
    }
    print(f"\nload average (1, 5, 15 min) before {load[0]}, after {load[1]}; "
          f"other processes used {busy:.0f}% of a CPU {hogs or ''}")  # fmt: skip
    results_file.save("sync", stamp, args.json, vars(args), results)
    return 0


def report(scenario: str, plan: tuple[str, str | None], runs: dict[str, list[Run]], size: int):
    version, basis = plan
    print(f"\n## {scenario}: dst {'has nothing' if basis is None else 'holds ' + basis} "
          f"-> {version}  (medians; bytes)")  # fmt: skip
    head = f"{'system':8} {'wire rx+tx':>13} {'rx':>13} {'tx':>11} {'seconds':>8} {'vCPU s':>10}"
    if scenario == "full":
        head += f" {'MiB/s':>7}"
    print(head + "   own figures (rsync --stats: literal, matched, sent, received)")
    print("  (vCPU s: busy seconds of the server's vCPU + the client's, softirq included)")
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        med = {
            "seconds": statistics.median(r.seconds for r in rs),
            "wire": statistics.median(r.wire for r in rs),
            "rx": statistics.median(r.rx for r in rs),
            "tx": statistics.median(r.tx for r in rs),
            "rx_packets": statistics.median(r.rx_packets for r in rs),
            "tx_packets": statistics.median(r.tx_packets for r in rs),
            "server_vcpu_s": statistics.median(r.server_vcpu_s for r in rs),
            "client_vcpu_s": statistics.median(r.client_vcpu_s for r in rs),
            "steal_s": statistics.median(r.steal_s for r in rs),
        }
        keys = rs[0].figures.keys()
        own = {  # medians of the numbers; anything else as the last run had it
            k: statistics.median(r.figures[k] for r in rs)
            if all(isinstance(r.figures[k], int | float) for r in rs)
            else rs[-1].figures[k]
            for k in keys
        }
        entry = {"median": med, "own_median": own, "runs": [asdict(r) for r in rs]}
        line = (f"{name:8} {med['wire']:>13,.0f} {med['rx']:>13,.0f} {med['tx']:>11,.0f} "
                f"{med['seconds']:>8.2f} {med['server_vcpu_s']:>4.2f}+{med['client_vcpu_s']:<4.2f}")  # fmt: skip
        if scenario == "full":
            entry["mib_per_s"] = size / MIB / med["seconds"]
            line += f" {entry['mib_per_s']:>7.1f}"
        if name == "rsync":
            line += (f"   {own['literal_data']:,.0f}, {own['matched_data']:,.0f}, "
                     f"{own['bytes_sent']:,.0f}, {own['bytes_received']:,.0f}")  # fmt: skip
        else:
            numbers = {k: v for k, v in own.items() if isinstance(v, int | float)}
            line += "   " + ", ".join(
                f"{k} {v:,.0f}" if float(v).is_integer() else f"{k} {v:,.3f}"
                for k, v in numbers.items()
            )
        print(line + f"   runs s {[round(r.seconds, 2) for r in rs]}")
        out[name] = entry
    if "rsync" in out:
        ref = out["rsync"]["median"]
        for name, entry in out.items():
            if name == "rsync":
                continue
            med = entry["median"]
            entry["vs_rsync"] = {
                "wire": med["wire"] / ref["wire"],
                "seconds": med["seconds"] / ref["seconds"],
            }
            print(f"{name} / rsync: wire {med['wire'] / ref['wire']:.2f}x, "
                  f"seconds {med['seconds'] / ref['seconds']:.2f}x"
                  + (f", throughput {ref['seconds'] / med['seconds']:.2f}x"
                     if scenario == "full" else ""))  # fmt: skip
        if len(out) == 1:
            print("(rsync only: no ratio)")
    return out
