"""bench.http's ``flood`` scenario: a legitimate client's request times while one source
holds a slowloris flood on the server (issue 16), Rackboot and nginx in the same run.

Per server and repeat: the legitimate requests on a quiet server (the reference),
then ``bench/http/slowloris.py`` from its own namespace (``--flood-connections``,
a byte a second, reopened when closed) and, once every flood connection was tried
and one more second passed, the same requests again: each a fresh ``curl``
(a new connection, as a booting machine makes), ``--max-time`` bounded. A
failure (503, reset, time out) is counted, not timed.
"""

from __future__ import annotations

import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.support.netns import Host

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 5  # of each kind per measurement
MAX_TIME = 10.0  # seconds one legitimate request may take before it counts as failed
READY_TIMEOUT = 30.0
FILE_MIB = 16


def fetch_times(cli: Host, targets: tuple[str, str], cpu: str) -> dict[str, list[float | None]]:
    """``REQUESTS`` fetches of the file and of the script: seconds each, None if failed."""
    out: dict[str, list[float | None]] = {"file": [], "script": []}
    for _ in range(REQUESTS):
        for kind, target in zip(("file", "script"), targets, strict=True):
            res = cli.run(["taskset", "-c", cpu, "curl", "-sS", "--fail", "-o", "/dev/null",
                           "--max-time", str(MAX_TIME), "-w", "%{time_total}", target],
                          timeout=MAX_TIME + 20)  # fmt: skip
            out[kind].append(float(res.stdout) if res.returncode == 0 else None)
    return out


def start_flood(fld: Host, addr: str, port: int, connections: int, cpu: str) -> subprocess.Popen:
    proc = fld.popen(
        ["taskset", "-c", cpu, sys.executable, "-m", "bench.http.slowloris", addr, str(port),
         "--connections", str(connections), "--seconds", "300"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT)
    line = proc.stdout.readline() if ready else b""
    if b"ready" not in line:
        proc.kill()
        raise RuntimeError(f"the flood did not start: {proc.stderr.read().decode()[-500:]}")
    time.sleep(1.0)  # one more tick: the server has seen every connection
    return proc


def stop_flood(proc: subprocess.Popen) -> dict:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return json.loads(out.decode().strip().splitlines()[-1])


def measure(
    cli: Host, fld: Host, addr: str, ports: dict[str, int], targets: dict[str, tuple[str, str]],
    connections: int, repeats: int, cpu: str,
) -> dict:  # fmt: skip
    runs: dict[str, dict[str, list]] = {
        name: {"quiet": [], "flood": [], "flooder": []} for name in targets
    }
    load = [os.getloadavg()[0]]
    for i in range(repeats):
        for name in list(targets) if i % 2 == 0 else list(reversed(targets)):
            runs[name]["quiet"].append(fetch_times(cli, targets[name], cpu))
            flood = start_flood(fld, addr, ports[name], connections, cpu)
            try:
                runs[name]["flood"].append(fetch_times(cli, targets[name], cpu))
            finally:
                runs[name]["flooder"].append(stop_flood(flood))
            load.append(os.getloadavg()[0])
    return report(runs, connections, load)


def _summary(measurements: list[dict[str, list[float | None]]], kind: str) -> dict:
    times = [t for m in measurements for t in m[kind]]
    ok = [t for t in times if t is not None]
    return {
        "median_s": statistics.median(ok) if ok else None,
        "max_s": max(ok) if ok else None,
        "failed": len(times) - len(ok),
        "requests": len(times),
    }


def report(runs: dict[str, dict[str, list]], connections: int, load: list[float]) -> dict:
    out: dict = {"flood_connections": connections, "loadavg_1min": load}
    print(f"flood: {connections} slowloris connections from one source; "
          f"{REQUESTS} fresh curl requests of each kind per run; load average (1 min) "
          f"{min(load):.2f}-{max(load):.2f}")  # fmt: skip
    for name, measured in runs.items():
        out[name] = {state: {kind: _summary(measured[state], kind) for kind in ("file", "script")}
                     for state in ("quiet", "flood")}  # fmt: skip
        out[name]["flooder"] = measured["flooder"]
        for state in ("quiet", "flood"):
            cells = []
            for kind in ("file", "script"):
                s = out[name][state][kind]
                median = "-" if s["median_s"] is None else f"{s['median_s'] * 1000:.1f}"
                top = "-" if s["max_s"] is None else f"{s['max_s'] * 1000:.1f}"
                cells.append(
                    f"{kind} median {median} ms max {top} ms failed {s['failed']}/{s['requests']}"
                )
            print(f"  {name:8} {state:5}  " + "; ".join(cells))
        refused = [f["answered_503"] for f in measured["flooder"]]
        print(f"  {name:8} flooder: connections opened per run {[f['opened'] for f in measured['flooder']]}, "
              f"503s {refused}")  # fmt: skip
    return out
