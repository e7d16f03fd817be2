"""python -m bench.cli: how long each CLI takes to answer, Rackboot's beside Kea's.

    flock /tmp/rackboot-bench.lock .venv/bin/python -m bench.cli [--runs 30] [--leases 50] [--json]

Three pairs, each command run ``--runs`` times, the six interleaved round by round so
that both sides see the same machine load:

* start-up alone: ``rackboot version`` beside ``kea-shell -v``;
* a status query of a running server: ``rackboot status`` beside
  ``kea-shell ... status-get`` (through kea-ctrl-agent, as Kea's operators ask);
* a plugin command listing the leases: ``rackboot leases list`` beside
  ``kea-shell ... lease4-get-all``, each server holding ``--leases`` leases.

Wall time per run (from fork to exit) and the CPU time the command used (its own and
its children's); medians, 10th and 90th percentiles, ratios of the medians. The
issue's targets: ``version`` <= 0.15 s, ``status`` <= 0.25 s on this machine. Needs
root only to install kea-ctrl-agent (kea-shell) and kea-dhcp4 when missing; no
network leaves loopback.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.cli.servers import RACKBOOT, Kea, RackbootNode
from bench.results_file import save

PACKAGES = ["kea-dhcp4-server", "kea-ctrl-agent"]  # kea-shell comes with the agent
WARMUP = 2  # runs of each command not counted (page cache, pyc files)
COMMAND_TIMEOUT = 60.0


def commands(node: RackbootNode, kea: Kea) -> dict[str, list[str]]:
    shell = ["kea-shell", "--host", "127.0.0.1", "--port", str(kea.port), "--service", "dhcp4"]
    config = ["--config", str(node.config)]
    return {
        "rackboot version": [RACKBOOT, "version"],
        "kea-shell -v": ["kea-shell", "-v"],
        "rackboot status": [RACKBOOT, "status", *config],
        "kea-shell status-get": [*shell, "status-get"],
        "rackboot leases list": [RACKBOOT, "leases", "list", *config],
        "kea-shell lease4-get-all": [*shell, "lease4-get-all"],
    }


PAIRS = (("version", "rackboot version", "kea-shell -v"),
         ("status", "rackboot status", "kea-shell status-get"),
         ("leases", "rackboot leases list", "kea-shell lease4-get-all"))  # fmt: skip
TARGETS = {"rackboot version": 0.15, "rackboot status": 0.25}


def timed(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, input="", capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"bench.cli: {' '.join(argv)} exited {done.returncode}: {done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def check_same_work(outputs: dict[str, str], leases: int) -> None:
    """Both listings hold every lease: the two sides do the same work."""
    listed = [line for line in outputs["rackboot leases list"].splitlines()[1:] if line.strip()]
    kea = outputs["kea-shell lease4-get-all"].count('"ip-address"')
    if len(listed) != leases or kea != leases:
        raise SystemExit(
            f"bench.cli: leases listed: rackboot {len(listed)}, kea {kea}, wanted {leases}"
        )


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p10": ordered[len(ordered) // 10],
            "p90": ordered[min(len(ordered) - 1, len(ordered) * 9 // 10)]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--runs", type=int, default=30, help="counted runs of each command")
    parser.add_argument("--leases", type=int, default=50, help="leases each server holds")
    parser.add_argument("--json", nargs="?", const="", default=None, metavar="FILE",
                        help="save the results (default bench/results/cli-TIME.json)")  # fmt: skip
    args = parser.parse_args(argv)
    if os.geteuid() == 0:
        from bench.dhcp.system import ensure_packages

        ensure_packages(PACKAGES)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        work = Path(tmp)
        (work / "kea").mkdir()
        node, kea = RackbootNode(work), None
        try:
            kea = Kea(work / "kea")
            node.add_leases(args.leases)
            kea.add_leases(args.leases)
            argvs = commands(node, kea)
            walls: dict[str, list[float]] = {name: [] for name in argvs}
            cpus: dict[str, list[float]] = {name: [] for name in argvs}
            outputs: dict[str, str] = {}
            for round_ in range(WARMUP + args.runs):
                for name, argv in argvs.items():
                    wall, cpu, outputs[name] = timed(argv)
                    if round_ >= WARMUP:
                        walls[name].append(wall)
                        cpus[name].append(cpu)
            check_same_work(outputs, args.leases)
        finally:
            node.stop()
            if kea is not None:
                kea.stop()
    load_after = os.getloadavg()
    results = {name: {"wall": summary(walls[name]), "cpu": summary(cpus[name])} for name in walls}
    print(f"bench.cli: {args.runs} runs each (+{WARMUP} warm-up), {args.leases} leases per server, "
          f"{os.cpu_count()} CPUs, load {load_before[0]:.2f} before, {load_after[0]:.2f} after")  # fmt: skip
    print(f"{'command':<28}{'wall median':>12}{'p10':>8}{'p90':>8}{'CPU median':>12}  target")
    for name, result in results.items():
        wall, cpu = result["wall"], result["cpu"]
        target = TARGETS.get(name)
        verdict = (
            ""
            if target is None
            else f"<= {target} s: {'met' if wall['median'] <= target else 'NOT met'}"
        )
        print(f"{name:<28}{wall['median']:>11.3f}s{wall['p10']:>7.3f}s{wall['p90']:>7.3f}s"
              f"{cpu['median']:>11.3f}s  {verdict}")  # fmt: skip
    ratios = {}
    for what, ours, theirs in PAIRS:
        ratios[what] = results[ours]["wall"]["median"] / results[theirs]["wall"]["median"]
        print(f"ratio {what}: {ours} / {theirs} = {ratios[what]:.2f}x (wall medians)")
    if args.json is not None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        save("cli", stamp, args.json, vars(args),
             {"commands": results, "ratios": ratios, "load": [load_before, load_after]})  # fmt: skip
    return 0
