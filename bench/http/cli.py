"""``python -m bench.http``: HTTP boot, Rackboot vs nginx (``sendfile on``), same run.

Scenarios (bench/README.md): ``download``: a 512 MiB file to 1 and to 16 concurrent
curl clients (aggregate MiB/s); ``scripts``: small boot-script requests per second
with wrk (16 connections, keep-alive): Rackboot renders the machine's iPXE script,
a new boot each (no lease), nginx sends a static file of the same size;
``scripts-leased``: the same, for a machine whose DHCP lease at the client's address is
committed to the state log before the run, so every fetch reuses its boot (a refetch
under the same lease); ``small``: the same load on a 1 KiB
static file from both; each with the server's CPU time per request; ``flood``: a 16 MiB file's and a
script's request times, quiet and under one source's slowloris flood (flood.py). Both servers run at once in one
namespace, pinned to the same vCPU, one process each (nginx ``worker_processes 1``,
its access log on like Rackboot's); clients run in another namespace on the other
vCPU. The repeats alternate the order. Every download's size is checked, and one
download from each is compared byte for byte first.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from bench import results_file
from bench.dhcp import profile
from bench.dhcp.system import LowLatency, OtherCPU, cpu_model, missing_packages
from bench.http import flood
from bench.tftp.servers import apt
from tests.support.netns import Host, Lab
from tests.support.nodeproc import start_node

PACKAGES = ["nginx-light", "curl", "wrk", "util-linux"]
PORTS = {"rackboot": 80, "nginx": 8080}
MIB = 1 << 20
SMALL_BYTES = 1024  # the ``small`` scenario's static file
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MAC = "52-54-00-12-34-56"
# No DHCP here, so no lease binds a machine's script to its address: any may fetch it.
UNBOUND = "bind_tokens_to_lease = false\n"
# scripts-leased: the machine whose lease at the client's address is committed before the run.
LEASED_MAC = "52-54-00-77-00-10"
LEASE_SECONDS = 86400.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=512, help="download size (512)")
    p.add_argument("--repeats", type=int, default=3, help="runs per server and scenario (3)")
    p.add_argument("--concurrency", default="1,16", help="download client counts (1,16)")
    p.add_argument("--scenarios", default="download,scripts,scripts-leased,small,flood",
                   help="which, in order")  # fmt: skip
    p.add_argument("--wrk-seconds", type=int, default=5, help="length of one wrk run (5)")
    p.add_argument("--flood-connections", type=int, default=600,
                   help="slowloris connections of the flood scenario (600)")  # fmt: skip
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                   help="both servers write an access log line per request (default on)")  # fmt: skip
    p.add_argument("--profile", action="store_true",
                   help="after the wrk runs, one more on Rackboot under py-spy (not counted)")  # fmt: skip
    p.add_argument("--server-cpu", default="0", help="taskset CPU list of both servers (0)")
    p.add_argument("--client-cpu", default="1", help="taskset CPU list of the clients (1)")
    p.add_argument("--lowlat", action=argparse.BooleanOptionalAction, default=True,
                   help="hold /dev/cpu_dma_latency at 0 during the run (default on)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    p.add_argument("--json", nargs="?", const="", default=None, help="save to bench/results/")
    return p.parse_args(argv)


def commit_lease(config: Path, work: Path, address: str, mac: str) -> None:
    """A bound DHCP lease of ``mac`` at ``address``, committed to the node's state log before
    it starts, as the DHCP plugin writes it (namespace dhcp.leases): one snapshot restored
    with ``rackboot state restore``."""
    from appliance.state.backup import write_backup
    from appliance.state.records import Record
    from appliance.state.tables import Tables
    from plugins.dhcp.leases import NAMESPACE, Lease, LeaseState, lease_value

    hwaddr = bytes.fromhex(mac.replace("-", ""))
    now = time.time()
    subnet = str(ipaddress.ip_network(f"{address}/24", strict=False))
    lease = Lease(int(ipaddress.IPv4Address(address)), b"\x01" + hwaddr, hwaddr, subnet,
                  LeaseState.BOUND, now, now + LEASE_SECONDS)  # fmt: skip
    tables = Tables()
    tables.apply(Record(1, 1, NAMESPACE, address, lease_value(lease)))
    write_backup(tables, work / "leases.state")
    env = {**os.environ, "XDG_DATA_HOME": str(work / "xdg")}
    subprocess.run([sys.executable, "-m", "appliance", "state", "restore", "--config", str(config),
                    str(work / "leases.state")], check=True, capture_output=True, env=env,
                   timeout=60)  # fmt: skip


def start_rackboot(
    srv: Host, root: Path, work: Path, cpu: str, access_log: bool, leased: str | None = None
) -> subprocess.Popen:
    """Rackboot on port 80; ``leased``: the address holding LEASED_MAC's lease (committed
    to its state log first)."""
    config = work / "rackboot.toml"
    config.write_text(
        # Only httpboot: the other plugins' services would share its vCPU. Its shipped
        # limits (max_connections 512, 32 per source): what the flood scenario meets.
        '[plugins]\ndisabled = ["dhcp", "tftp"]\n'
        f'[node]\nname = "bench"\ndata_dir = "{work / "data"}"\n'
        f'[httpboot]\naddresses = ["{srv.addr}"]\nport = {PORTS["rackboot"]}\nroot = "{root}"\n'
        f"{UNBOUND}access_log = {str(access_log).lower()}\n"
    )
    if leased is not None:
        commit_lease(config, work, leased, LEASED_MAC)
    return start_node(
        srv, config, work / "data" / "control.sock", work, "httpboot", prefix=("taskset", "-c", cpu)
    )


def start_nginx(srv: Host, root: Path, work: Path, cpu: str, access_log: bool) -> subprocess.Popen:
    conf = work / "nginx.conf"
    conf.write_text(
        f"user root; daemon off; worker_processes 1; pid {work}/nginx.pid;\n"
        f"error_log {work}/nginx-error.log;\n"
        "events { worker_connections 4096; }\n"
        "http {\n  sendfile on; tcp_nopush on; keepalive_requests 1000000;\n"
        f"  access_log {f'{work}/nginx-access.log' if access_log else 'off'};\n"
        f"  server {{ listen {srv.addr}:{PORTS['nginx']}; location /boot/ {{ alias {root}/; }} }}\n"
        "}\n"
    )
    proc = srv.popen(
        ["taskset", "-c", cpu, "nginx", "-c", str(conf), "-p", str(work)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(100):
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {(work / 'nginx-error.log').read_text()[-800:]}")
        res = srv.run(["curl", "-s", "-o", "/dev/null", f"http://{srv.addr}:{PORTS['nginx']}/"])
        if res.returncode == 0:
            return proc
        time.sleep(0.05)
    raise RuntimeError("nginx did not answer")


def url(srv: Host, server: str, path: str) -> str:
    return f"http://{srv.addr}:{PORTS[server]}{path}"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def download(cli: Host, target: str, n: int, size: int, cpu: str, timeout: float) -> float:
    """Wall seconds for ``n`` simultaneous curl downloads of ``target`` (sizes checked)."""
    argv = [
        "taskset",
        "-c",
        cpu,
        "curl",
        "-sS",
        "--fail",
        "-o",
        "/dev/null",
        "-w",
        "%{size_download}\n",
    ]
    started = time.monotonic()
    procs = [
        cli.popen([*argv, target], stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(n)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0 or int(out.decode().strip() or 0) != size:
            raise RuntimeError(
                f"download failed: {err.decode()[-300:]} size {out.decode().strip()}"
            )
    return time.monotonic() - started


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of ``pid`` and its live descendants (nginx's worker)."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rpartition(")")[2].split()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue  # gone meanwhile
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
        todo += [int(child) for child in children]
    return total


def wrk(cli: Host, target: str, seconds: int, cpu: str, server_pid: int) -> tuple[float, float]:
    """``wrk -t1 -c16`` (keep-alive) on ``target``: requests/s and the server's CPU
    microseconds per request over the run. A few answers other than 2xx/3xx are reported,
    not fatal (Rackboot's access log in node.log says which); more than 1 % is."""
    before = cpu_seconds(server_pid)
    res = cli.run(["taskset", "-c", cpu, "wrk", "-t1", "-c16", f"-d{seconds}s", target],
                  timeout=seconds + 60)  # fmt: skip
    used = cpu_seconds(server_pid) - before
    match = re.search(r"Requests/sec:\s+([\d.]+)", res.stdout)
    total = re.search(r"(\d+) requests in", res.stdout)
    refused = re.search(r"Non-2xx or 3xx responses: (\d+)", res.stdout)
    if (
        res.returncode != 0
        or match is None
        or total is None
        or (refused is not None and int(refused.group(1)) * 100 > int(total.group(1)))
    ):
        raise RuntimeError(f"wrk failed: {res.stdout[-500:]} {res.stderr[-300:]}")
    if refused is not None:
        print(f"  {target}: {refused.group(1)} of {total.group(1)} answers not 2xx/3xx")
    return float(match.group(1)), used * 1e6 / max(int(total.group(1)), 1)


def rates(cli: Host, targets: dict[str, str], pids: dict[str, int], args) -> dict:
    """Repeated wrk runs on each server's target, the order alternated: req/s and CPU µs."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    for i in range(args.repeats):
        for name in list(targets) if i % 2 == 0 else list(reversed(targets)):
            runs[name].append(
                wrk(cli, targets[name], args.wrk_seconds, args.client_cpu, pids[name])
            )
    if args.profile:
        out = Path(tempfile.mkdtemp(prefix="rackboot-bench-http-spy-")) / "rackboot.txt"
        spy = profile.start_py_spy(pids["rackboot"], args.wrk_seconds, out)
        wrk(cli, targets["rackboot"], args.wrk_seconds, args.client_cpu, pids["rackboot"])
        spy.communicate(timeout=args.wrk_seconds + 30)
        print(f"py-spy of Rackboot over one more run ({out}):")
        print(profile.summarize_collapsed(profile.read_collapsed([out]), top=40))
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.http must run as root (namespaces, apt-get, port 80)", file=sys.stderr)
        return 2
    missing = missing_packages(PACKAGES)
    if missing and apt("install", "-y", "--no-install-recommends", *missing).returncode != 0:
        apt("update")
        apt("install", "-y", "--no-install-recommends", *missing)
    scenarios = [s for s in args.scenarios.split(",") if s]
    work = Path(tempfile.mkdtemp(prefix="rackboot-bench-http-"))
    os.chmod(work, 0o755)
    root = work / "root"
    root.mkdir(mode=0o755)
    size = args.size_mib * MIB
    with (root / "big.bin").open("wb") as f:
        for _ in range(args.size_mib):
            f.write(os.urandom(MIB))
    (root / "vmlinuz").write_bytes(os.urandom(flood.FILE_MIB * MIB))
    (root / "small.bin").write_bytes(os.urandom(SMALL_BYTES))
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    results: dict[str, dict] = {}
    try:
        with LowLatency(args.lowlat) as lowlat, Lab(prefix="rbh") as lab:
            srv, cli, fld = lab.add_host("srv"), lab.add_host("cli"), lab.add_host("fld")
            pids = {
                "rackboot": start_rackboot(srv, root, work, args.server_cpu, args.access_log,
                                           leased=cli.addr).pid
            }  # fmt: skip
            script = cli.run(
                ["curl", "-sS", "--fail", url(srv, "rackboot", f"/boot/{MAC}.ipxe")]
            ).stdout
            (root / "script.ipxe").write_text(script)  # nginx's static twin, same size
            leased_script = check_leased(cli, srv)
            (root / "script-leased.ipxe").write_text(leased_script)  # its twin
            pids["nginx"] = start_nginx(srv, root, work, args.server_cpu, args.access_log).pid
            targets = {
                "rackboot": (
                    url(srv, "rackboot", "/boot/big.bin"),
                    url(srv, "rackboot", f"/boot/{MAC}.ipxe"),
                ),
                "nginx": (
                    url(srv, "nginx", "/boot/big.bin"),
                    url(srv, "nginx", "/boot/script.ipxe"),
                ),
            }
            digest = sha256_of(root / "big.bin")
            for name, (big, _) in targets.items():  # byte for byte, and the page cache warm
                copy = work / f"check-{name}"
                cli.run(["curl", "-sS", "--fail", "-o", str(copy), big], timeout=args.timeout)
                if sha256_of(copy) != digest:
                    raise RuntimeError(f"{name} served different bytes")
                copy.unlink()
            print(f"bench.http {stamp}: {args.size_mib} MiB file, median of {args.repeats}")
            print(f"env: cpu={cpu_model()} vcpus={os.cpu_count()} python={sys.version.split()[0]} "
                  f"lowlat={lowlat.label} server cpu {args.server_cpu}, client cpu {args.client_cpu}, "
                  f"nginx={nginx_version()} worker_processes 1 access_log={args.access_log}")  # fmt: skip
            others = OtherCPU(lab.namespaces)
            others.start()
            if "download" in scenarios:
                for n in (int(c) for c in args.concurrency.split(",")):
                    walls: dict[str, list[float]] = {"rackboot": [], "nginx": []}
                    for i in range(args.repeats):
                        for name in ["rackboot", "nginx"] if i % 2 == 0 else ["nginx", "rackboot"]:
                            walls[name].append(
                                download(
                                    cli, targets[name][0], n, size, args.client_cpu, args.timeout
                                )
                            )
                    results[f"download-{n}"] = report_download(n, size, walls)
            if "scripts" in scenarios:
                runs = rates(cli, {name: t[1] for name, t in targets.items()}, pids, args)
                results["scripts"] = report_rates(f"scripts ({len(script)} B)", runs)
            if "scripts-leased" in scenarios:
                runs = rates(cli, {"rackboot": url(srv, "rackboot", f"/boot/{LEASED_MAC}.ipxe"),
                                   "nginx": url(srv, "nginx", "/boot/script-leased.ipxe")},
                             pids, args)  # fmt: skip
                results["scripts-leased"] = report_rates(
                    f"scripts under a lease, the boot reused ({len(leased_script)} B)", runs
                )
            if "small" in scenarios:
                runs = rates(cli, {name: url(srv, name, "/boot/small.bin") for name in PORTS},
                             pids, args)  # fmt: skip
                results["small"] = report_rates(f"small file ({SMALL_BYTES} B)", runs)
            print(f"rackboot's answers other than 200: {unusual_statuses(work / 'node.log')}")
            if "flood" in scenarios:
                results["flood"] = flood.measure(
                    cli, fld, srv.addr, PORTS,
                    {"rackboot": (url(srv, "rackboot", "/boot/vmlinuz"), targets["rackboot"][1]),
                     "nginx": (url(srv, "nginx", "/boot/vmlinuz"), targets["nginx"][1])},
                    args.flood_connections, args.repeats, args.client_cpu,
                )  # fmt: skip
            busy, hogs = others.stop()
            print(f"other processes meanwhile: {busy:.0f}% of a CPU {hogs or ''}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json is not None:
        results_file.save("http", stamp, args.json, vars(args), results)
    return 0


def check_leased(cli: Host, srv: Host) -> str:
    """LEASED_MAC's script as its leased address gets it: the same token at a second fetch
    (its boot reused, nothing committed). Its text."""
    target = url(srv, "rackboot", f"/boot/{LEASED_MAC}.ipxe")
    first, second = (cli.run(["curl", "-sS", "--fail", target]).stdout for _ in range(2))
    token = re.search(r"rackboot\.token=([0-9a-f]{32})", first)
    if token is None or first != second:
        raise RuntimeError(f"the leased machine's boot was not reused: {first!r} {second!r}")
    return first


def unusual_statuses(node_log: Path) -> dict[str, int]:
    """Rackboot's access-log lines with a status other than 200, counted by status, and
    its warnings and errors (empty without the access log)."""
    seen: Counter[str] = Counter()
    for line in node_log.read_text(errors="replace").splitlines():
        status = re.search(r" status=(\d+)", line)
        if status is not None and status.group(1) != "200":
            seen[status.group(1)] += 1
        elif "level=error" in line or "level=warning" in line:
            seen[line[:160]] += 1
    return dict(seen)


def nginx_version() -> str:
    res = subprocess.run(["nginx", "-v"], capture_output=True, text=True, timeout=10)
    return res.stderr.strip().rpartition("/")[2]


def report_download(n: int, size: int, walls: dict[str, list[float]]) -> dict:
    out = {}
    for name, runs in walls.items():
        median = statistics.median(runs)
        out[name] = {"wall_s": runs, "median_s": median, "aggregate_mib_s": n * size / MIB / median}
    ratio = out["rackboot"]["aggregate_mib_s"] / out["nginx"]["aggregate_mib_s"]
    out["ratio"] = ratio
    print(f"download n={n:<2}  rackboot {out['rackboot']['aggregate_mib_s']:7.0f} MiB/s   "
          f"nginx {out['nginx']['aggregate_mib_s']:7.0f} MiB/s   ratio {ratio:.2f}x   "
          f"(runs s: rackboot {[round(w, 2) for w in walls['rackboot']]}, "
          f"nginx {[round(w, 2) for w in walls['nginx']]})")  # fmt: skip
    return out


def report_rates(label: str, runs: dict[str, list[tuple[float, float]]]) -> dict:
    out: dict = {
        name: {"req_s": [r for r, _ in measured], "cpu_us_per_request": [c for _, c in measured],
               "median_req_s": statistics.median(r for r, _ in measured),
               "median_cpu_us": statistics.median(c for _, c in measured)}
        for name, measured in runs.items()
    }  # fmt: skip
    ratio = out["rackboot"]["median_req_s"] / out["nginx"]["median_req_s"]
    out["ratio"] = ratio
    print(f"{label}, wrk -c16:  rackboot {out['rackboot']['median_req_s']:8.0f} req/s "
          f"{out['rackboot']['median_cpu_us']:6.0f} µs CPU/req   "
          f"nginx {out['nginx']['median_req_s']:8.0f} req/s {out['nginx']['median_cpu_us']:6.0f} µs CPU/req   "
          f"ratio {ratio:.2f}x  (runs req/s: rackboot {[round(r) for r in out['rackboot']['req_s']]}, "
          f"nginx {[round(r) for r in out['nginx']['req_s']]})")  # fmt: skip
    return out
