"""``python -m bench.tftp``: a 64 MiB TFTP download, Rackboot vs tftpd-hpa and atftpd, same run.

Scenarios (bench/README.md): ``single`` (atftp, blksize 1468, lock-step) Rackboot
vs tftpd-hpa; ``window`` (atftp, blksize 1468, windowsize 16) Rackboot vs atftpd;
``concurrent`` (N curl clients at once, each from its own address, blksize 1468)
Rackboot vs tftpd-hpa; ``flood`` (``single``'s download started once another host
sent 500 never-acknowledged RRQs from 500 ports in 2 s: bench/tftp/flood.py)
Rackboot vs tftpd-hpa. All
servers run at once in one namespace, pinned to one vCPU, each on its own port;
the transfers of one repeat alternate between them (the order flips every repeat)
so drifting background load hits both alike. Every download is checked.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import results_file
from bench.dhcp.cli import wait_until_quiet
from bench.dhcp.system import LowLatency, OtherCPU, cpu_model, cpuidle_driver, missing_packages
from bench.tftp.servers import (
    CLIENT_PACKAGES,
    PORTS,
    Server,
    add_client_addresses,
    apt,
    atftpd_binary,
    client_argv,
)

SCENARIOS = {  # name: (client, windowsize, peer)
    "single": ("atftp", 1, "tftpd-hpa"),
    "window": ("atftp", 16, "atftpd"),
    "concurrent": ("curl", 1, "tftpd-hpa"),
    "flood": ("atftp", 1, "tftpd-hpa"),
}
FLOOD = ["--count", "500", "--seconds", "2", "--hold", "10"]  # the flood
SETTLE = 120.0  # seconds a server may take to drop the flood's transfers between runs
REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.tftp", description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=64, help="file size (default 64)")
    p.add_argument("--repeats", type=int, default=5, help="runs per server and scenario (5)")
    p.add_argument("--scenarios", default="single,window,concurrent", help="which, in order")
    p.add_argument("--concurrency", default="20,50", help="client counts for 'concurrent'")
    p.add_argument("--lowlat", action=argparse.BooleanOptionalAction, default=True,
                   help="hold /dev/cpu_dma_latency at 0 during the run (default on)")  # fmt: skip
    p.add_argument("--server-cpu", default="0", help="taskset CPU list of every server (0)")
    p.add_argument("--client-cpu", default="1", help="taskset CPU list of the clients (1)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take")
    p.add_argument("--tftp-set", action="append", default=[], metavar="'KEY = VALUE'",
                   help="extra [tftp] line for Rackboot, repeatable (e.g. 'busy_poll_us = 0')")  # fmt: skip
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="before each repeat, wait up to SECONDS for others to leave the CPUs idle")  # fmt: skip
    p.add_argument("--json", nargs="?", const="", default=None, help="save to bench/results/")
    return p.parse_args(argv)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


class Bench:
    def __init__(self, args, srv, cli, root: Path, dl: Path, digest: str) -> None:
        self.accounts: dict = {}  # server name -> servers.CpuAccount
        self.servers: dict = {}  # server name -> servers.Server
        self.fld = None  # the flooding host (scenario flood)
        self.sources: list[str] = []  # the client host's addresses, one per concurrent client
        self.args, self.srv, self.cli, self.root, self.dl, self.digest = (
            args,
            srv,
            cli,
            root,
            dl,
            digest,
        )

    def run(self, server: str, client: str, window: int, n: int) -> tuple:
        """Wall seconds for ``n`` simultaneous downloads (every file checked), the
        server's CPU seconds (all its threads and children; None if not measurable)
        and the server vCPU's (busy, softirq) seconds meanwhile."""
        dests = [self.dl / f"{server}-{i}" for i in range(n)]
        sources = self.sources or [self.cli.addr]
        argvs = [client_argv(client, self.srv, PORTS[server], "big.bin", d, window,
                             sources[i % len(sources)]) for i, d in enumerate(dests)]  # fmt: skip
        account = self.accounts[server]
        cpu0, busy0 = account.seconds(), cpus_busy(self.args.server_cpu)
        t0 = time.monotonic()
        procs = [self.cli.popen(["taskset", "-c", self.args.client_cpu, *a], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT) for a in argvs]  # fmt: skip
        failures = []
        for proc in procs:
            try:
                out, _ = proc.communicate(
                    timeout=max(1.0, t0 + self.args.timeout - time.monotonic())
                )
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate(timeout=10)
            if proc.returncode != 0:
                failures.append(f"rc {proc.returncode}: {out.decode(errors='replace')[-200:]}")
        wall = time.monotonic() - t0
        cpu = None if cpu0 is None else account.seconds() - cpu0
        busy = [b - a for a, b in zip(busy0, cpus_busy(self.args.server_cpu), strict=True)]
        for d in dests:
            if not failures and sha256(d) != self.digest:
                failures.append(f"{d.name}: content differs")
            d.unlink(missing_ok=True)
        if failures:
            raise RuntimeError(f"{server}: {len(failures)} failed: {failures[0]}")
        return wall, cpu, busy

    def flood_run(self, server: str, client: str) -> tuple:
        """One lock-step download started once the flood is sent (bench/tftp/flood.py),
        as :meth:`run` measures it, plus the flood's own summary; then wait until the
        server has dropped the flood's transfers."""
        argv = [sys.executable, "-m", "bench.tftp.flood", self.srv.addr, str(PORTS[server]),
                "--file", "big.bin", *FLOOD]  # fmt: skip
        flood = self.fld.popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
        try:
            if flood.stdout.readline().strip() != "sent":
                raise RuntimeError(f"the flood against {server} did not finish sending")
            measured = self.run(server, client, 1, 1)
            out, _ = flood.communicate(timeout=60)
        finally:
            if flood.poll() is None:
                flood.kill()
                flood.wait(timeout=10)
        summary = json.loads(out.strip().splitlines()[-1])
        settled = self.servers[server].wait_idle(self.srv, SETTLE)
        return (*measured, summary, settled)


def cpus_busy(cpulist: str) -> tuple[float, float]:
    """(busy, softirq) seconds of the CPUs in a taskset list like '0' or '0,1': busy is
    all but idle and iowait; softirq is the part the kernel spent in softirqs (with
    IRQ time accounting it is charged to no process: the sends' veth/bridge path)."""
    wanted = {f"cpu{c}" for c in cpulist.split(",")}
    busy = softirq = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name in wanted:
            v = [int(x) for x in values]
            busy += sum(v) - v[3] - v[4]
            softirq += v[6]
    hz = os.sysconf("SC_CLK_TCK")
    return busy / hz, softirq / hz


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.tftp must run as root (namespaces, apt-get, port 69)", file=sys.stderr)
        return 2
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        print(f"unknown scenarios: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    wanted = CLIENT_PACKAGES + ["tftpd-hpa"]
    missing = missing_packages(wanted)
    if missing and apt("install", "-y", "--no-install-recommends", *missing).returncode != 0:
        apt("update")
        apt("install", "-y", "--no-install-recommends", *missing)
    atftpd_binary()
    from tests.support.netns import Lab

    work = Path(tempfile.mkdtemp(prefix="rackboot-bench-tftp-"))
    shm = Path(tempfile.mkdtemp(prefix="rackboot-bench-tftp-", dir="/dev/shm"))
    os.chmod(work, 0o755)
    root, dl = work / "root", shm / "dl"
    root.mkdir(mode=0o755)
    dl.mkdir()
    size = args.size_mib * MIB
    with (root / "big.bin").open("wb") as f:
        for _ in range(args.size_mib):
            f.write(os.urandom(MIB))
    digest = sha256(root / "big.bin")
    servers = {name: Server(name, port, work=work) for name, port in PORTS.items()}
    servers["rackboot"].extra = tuple(args.tftp_set)
    results: dict[str, dict] = {}
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    try:
        with LowLatency(args.lowlat) as lowlat, Lab(prefix="rbt") as lab:
            srv, cli = lab.add_host("srv"), lab.add_host("cli")
            for server in servers.values():
                server.start(srv, root, work, args.server_cpu)
            bench = Bench(args, srv, cli, root, dl, digest)
            bench.accounts = {name: server.account for name, server in servers.items()}
            bench.servers = servers
            # One address per concurrent client, as machines in a rack: a server may
            # limit what one address holds (Rackboot: 4 transfers, docs/tftp.md).
            bench.sources = add_client_addresses(cli, max(
                [int(n) for n in args.concurrency.split(",")] + [1]))  # fmt: skip
            if "flood" in scenarios:
                bench.fld = lab.add_host("fld")
            print(
                f"bench.tftp {stamp}: {args.size_mib} MiB, blksize 1468, median of {args.repeats}"
            )
            print(f"env: cpu={cpu_model()} vcpus={os.cpu_count()} cpuidle={cpuidle_driver()} "
                  f"python={sys.version.split()[0]} lowlat={lowlat.label} "
                  f"server cpu {args.server_cpu}, client cpu {args.client_cpu}, "
                  f"rackboot [tftp] extra: {args.tftp_set or 'none'}")  # fmt: skip
            for scenario in scenarios:
                client, window, peer = SCENARIOS[scenario]
                counts = (
                    [int(n) for n in args.concurrency.split(",")]
                    if scenario == "concurrent"
                    else [1]
                )
                for n in counts:
                    label = f"{scenario}-{n}" if scenario == "concurrent" else scenario
                    pair = ["rackboot", peer]
                    for name in pair:  # warm-up, unmeasured: page cache, first fork
                        bench.run(name, client, window, 1)
                    runs: dict[str, list[tuple]] = {name: [] for name in pair}
                    others = OtherCPU(lab.namespaces)
                    others.start()
                    load = [load_average()]
                    for i in range(args.repeats):
                        if args.wait_quiet > 0:
                            wait_until_quiet(args.wait_quiet)
                        for name in pair if i % 2 == 0 else pair[::-1]:
                            if scenario == "flood":
                                runs[name].append(bench.flood_run(name, client))
                            else:
                                runs[name].append(bench.run(name, client, window, n))
                    busy, hogs = others.stop()
                    load.append(load_average())
                    blocks = n * (size // 1468 + 1)
                    results[label] = report(
                        label, client, window, n, size, blocks, runs, busy, hogs
                    )
                    results[label]["load_average"] = load
                    print(f"load average (1, 5, 15 min) before {load[0]}, after {load[1]}")
                    if scenario == "flood":
                        results[label]["flood"] = report_flood(runs)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    if args.json is not None:
        results_file.save("tftp", stamp, args.json, vars(args), results)
    return 0


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def report_flood(runs) -> dict:
    """What each server sent the flood (bench/tftp/flood.py's summaries), per run."""
    out = {}
    for name, rs in runs.items():
        summaries, settled = [r[3] for r in rs], [r[4] for r in rs]
        out[name] = {"summaries": summaries, "settle_s": settled}
        print(f"{name:10} flood: sockets sent DATA {[s['sockets_with_data'] for s in summaries]}, "
              f"bytes received / sent {[round(s['bytes_received'] / s['bytes_sent'], 2) for s in summaries]}, "
              f"most to a socket without DATA {[s['most_to_a_refused_socket'] for s in summaries]} "
              f"(request {summaries[0]['request_size']} bytes), "
              f"settled in {[None if t is None else round(t, 1) for t in settled]} s")  # fmt: skip
    return out


def report(label, client, window, n, size, blocks, runs, busy, hogs) -> dict:
    rb, peer = list(runs)
    walls = {name: [r[0] for r in rs] for name, rs in runs.items()}
    med = {name: statistics.median(ts) for name, ts in walls.items()}
    rate = {name: n * size / MIB / t for name, t in med.items()}

    def per_block(values) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) / blocks * 1e6 if values else None

    # CPU per DATA block (µs): the server's own (threads and children), and the
    # server vCPU's softirq time (the sends' path through veth and bridge).
    cpu_us = {name: per_block(r[1] for r in rs) for name, rs in runs.items()}
    sirq_us = {name: per_block(r[2][1] for r in rs) for name, rs in runs.items()}
    vcpu_us = {name: per_block(r[2][0] for r in rs) for name, rs in runs.items()}
    print(f"\n## {label}: {n} x {client}, windowsize {window}")
    for name in runs:
        listed = ", ".join(f"{t:.2f}" for t in walls[name])
        cpu = "n/a" if cpu_us[name] is None else f"{cpu_us[name]:5.1f}"
        print(f"{name:10} median {med[name]:7.2f} s  {rate[name]:7.1f} MiB/s  "
              f"us/block: cpu {cpu} + softirq {sirq_us[name]:4.1f} (vCPU busy {vcpu_us[name]:5.1f})  "
              f"runs [{listed}]")  # fmt: skip
    ratio = rate[rb] / rate[peer]
    line = f"rackboot / {peer} = {ratio:.2f}x"
    if cpu_us[rb] and cpu_us[peer]:
        cost = (cpu_us[rb] + sirq_us[rb]) / (cpu_us[peer] + sirq_us[peer])
        line += f"   CPU per block (cpu + softirq) rackboot / {peer} = {cost:.2f}x"
    print(line + (f"   [others used {busy:.0f}% CPU: {', '.join(hogs)}]" if busy >= 10 else ""))
    return {
        "runs": walls,
        "median_s": med,
        "mib_per_s": rate,
        "ratio": ratio,
        "cpu_us_per_block": cpu_us,
        "softirq_us_per_block": sirq_us,
        "vcpu_busy_us_per_block": vcpu_us,
        "others_cpu_pct": busy,
    }
