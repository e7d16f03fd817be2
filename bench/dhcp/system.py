"""Host side of the benchmark: root, Debian packages, the environment line, CPU wake-up latency."""

from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

APT_TIMEOUT = 900.0  # one apt-get call; a cold download of Kea takes well under that

# Debian package of every program the benchmark runs. dnsmasq-base is the binary
# alone: the `dnsmasq` package only adds the system service, which we never use.
BASE_PACKAGES = ["iproute2", "util-linux", "kea-admin"]  # ip, taskset, perfdhcp
SERVER_PACKAGES = {
    "kea": ["kea-dhcp4-server"],
    "dnsmasq": ["dnsmasq-base"],
    "dnsmasq-ping": ["dnsmasq-base"],
    "rackboot": [],
    # --ha: the hot-standby pair talks through the control agents; curl asks them the state
    "kea-ha": ["kea-dhcp4-server", "kea-ctrl-agent", "curl"],
    "rackboot-ha": [],
}


def not_root_reason() -> str | None:
    if os.geteuid() != 0:
        return (
            "bench.dhcp must run as root: it creates network namespaces, installs the "
            f"peers with apt-get and binds DHCP ports (euid {os.geteuid()}). "
            "Run it as root, e.g. `sudo python -m bench.dhcp`."
        )
    return None


def missing_packages(packages: Iterable[str]) -> list[str]:
    missing = []
    for pkg in packages:
        res = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True, timeout=30
        )
        if res.returncode != 0 or "install ok installed" not in res.stdout:
            missing.append(pkg)
    return missing


def ensure_packages(packages: Iterable[str], log=print) -> None:
    """apt-get install the packages that are missing; retry once after apt-get update.

    apt may start the packages' own system services in the host namespace (or, as
    in a container with policy-rc.d, not at all). We leave those alone: our
    instances run inside our own namespaces with their own files and never meet them.
    """
    missing = missing_packages(packages)
    if not missing:
        return
    log(f"installing Debian packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT)
    if res.returncode != 0:
        subprocess.run(
            ["apt-get", "update"], capture_output=True, text=True, env=env, timeout=APT_TIMEOUT
        )
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT)
    if res.returncode != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"bench.dhcp: `{' '.join(argv)}` failed:\n{tail}")
    still = missing_packages(missing)
    if still:
        raise SystemExit(f"bench.dhcp: packages still missing after apt-get: {' '.join(still)}")


def _first_line(argv: list[str]) -> str:
    if not shutil.which(argv[0]):
        return "not installed"
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"? ({exc})"
    lines = (res.stdout + res.stderr).strip().splitlines()
    return lines[0].strip() if lines else "?"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def versions(servers: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    out["perfdhcp"] = _first_line(["perfdhcp", "-v"]).replace("VERSION:", "").strip()
    wanted = set(servers)
    if wanted & {"kea", "kea-ha"}:
        out["kea"] = _first_line(["kea-dhcp4", "-v"])
    if wanted & {"dnsmasq", "dnsmasq-ping"}:
        line = _first_line(["dnsmasq", "--version"])  # "Dnsmasq version 2.90  Copyright ..."
        parts = line.split()
        out["dnsmasq"] = parts[2] if len(parts) > 2 and parts[1] == "version" else line
    if wanted & {"rackboot", "rackboot-ha"}:
        out["rackboot"] = (
            _first_line([sys.executable, "-m", "appliance", "version"])
            .replace("rackboot", "")
            .strip()
        )
    return out


def cpuidle_driver() -> str:
    """The cpuidle driver; "none" means idle vCPUs just HLT and PM QoS changes nothing."""
    try:
        return Path("/sys/devices/system/cpu/cpuidle/current_driver").read_text().strip()
    except OSError:
        return "none"


def environment(servers: Iterable[str], lowlat: str) -> dict[str, str | int]:
    return {
        "cpu": cpu_model(),
        "vcpus": os.cpu_count() or 0,
        "kernel": platform.release(),
        "cpuidle": cpuidle_driver(),
        "python": platform.python_version(),
        **versions(servers),
        "lowlat": lowlat,
    }


class LowLatency:
    """Hold /dev/cpu_dma_latency at 0 while open: idle vCPUs poll instead of halting.

    On this VM a halted vCPU takes ~40-70 us to wake, which caps lock-step work; the
    PM QoS request lasts exactly as long as the file descriptor stays open, so it
    ends with this process whatever happens.
    """

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self.fd: int | None = None
        self.reason = ""

    def __enter__(self) -> LowLatency:
        if not self.wanted:
            self.reason = "off (default CPU idle states)"
            return self
        try:
            fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
            os.write(fd, struct.pack("i", 0))
        except OSError as exc:
            self.reason = f"UNAVAILABLE ({exc.strerror}): measured with default CPU idle states"
            return self
        self.fd = fd
        self.reason = "on (/dev/cpu_dma_latency held at 0)"
        if cpuidle_driver() == "none":
            # Without a cpuidle driver the kernel's idle loop halts regardless of PM QoS.
            self.reason = (
                "on (/dev/cpu_dma_latency held at 0, but this kernel has no cpuidle "
                "driver: idle vCPUs still halt, so it changes nothing here)"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @property
    def label(self) -> str:
        return self.reason


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # without guest times, already counted in user
    return total - idle, total


PF_KTHREAD = 0x00200000


def _proc_times() -> dict[int, tuple[str, int]]:
    """User processes' CPU time in clock ticks, by pid."""
    out: dict[int, tuple[str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        rest = stat[stat.rfind(")") + 2 :].split()
        if int(rest[6]) & PF_KTHREAD:
            continue  # kernel threads (ksoftirqd...) also carry our own packets
        out[int(entry.name)] = (name, int(rest[11]) + int(rest[12]))  # utime + stime
    return out


def background_load(seconds: float = 1.0) -> tuple[float, list[str]]:
    """CPU busy share (% of all CPUs) while we run nothing, and the processes using it.

    Other work on the machine (someone else's benchmark, a build) shares the two
    vCPUs with the server and perfdhcp and makes results low and noisy.
    """
    import time

    busy0, total0 = _cpu_times()
    procs0 = _proc_times()
    time.sleep(seconds)
    busy1, total1 = _cpu_times()
    procs1 = _proc_times()
    share = 100.0 * (busy1 - busy0) / max(1, total1 - total0)
    hz = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    hogs = []
    for pid, (name, t1) in procs1.items():
        if pid == me:
            continue
        t0 = procs0[pid][1] if pid in procs0 else t1  # new: its time may predate our window
        pct = 100.0 * (t1 - t0) / hz / seconds
        if pct >= 5.0:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                cmd = name
            hogs.append((pct, f"pid {pid} {(cmd.strip() or name)[:60]} {pct:.0f}%"))
    return share, [h for _, h in sorted(hogs, reverse=True)[:3]]


def netns_inode(name: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


class OtherCPU:
    """CPU time used by processes outside the lab's namespaces while a run was going on.

    The server and perfdhcp live in the lab's namespaces; anything else burning CPU
    at the same time (another session's benchmark, a build) competes for the same
    two vCPUs. ``pct`` is in percent of one CPU over the measured interval; processes
    that both start and end inside the interval are not seen.
    """

    def __init__(self, lab_namespaces: Iterable[str]) -> None:
        self.exclude = {i for i in map(netns_inode, lab_namespaces) if i is not None}
        self.hz = os.sysconf("SC_CLK_TCK")
        self.me = os.getpid()
        self._t0 = 0.0
        self._snap: dict[int, tuple[str, int]] = {}

    def _snapshot(self) -> dict[int, tuple[str, int]]:
        procs = _proc_times()
        out = {}
        for pid, value in procs.items():
            if pid == self.me:
                continue
            try:
                if os.stat(f"/proc/{pid}/ns/net").st_ino in self.exclude:
                    continue
            except OSError:
                continue
            out[pid] = value
        return out

    def start(self) -> None:
        import time

        self._t0 = time.monotonic()
        self._snap = self._snapshot()

    def stop(self) -> tuple[float, list[str]]:
        """(percent of one CPU used by others, the busiest of them)."""
        import time

        elapsed = max(1e-3, time.monotonic() - self._t0)
        now = self._snapshot()
        total = 0
        hogs = []
        for pid, (name, t1) in now.items():
            t0 = self._snap.get(pid, (name, 0))[1]
            delta = max(0, t1 - t0)
            total += delta
            pct = 100.0 * delta / self.hz / elapsed
            if pct >= 5.0:
                hogs.append((pct, f"{name}[{pid}] {pct:.0f}%"))
        return 100.0 * total / self.hz / elapsed, [h for _, h in sorted(hogs, reverse=True)[:3]]
