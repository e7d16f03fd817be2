"""The TFTP servers and clients of bench.tftp: how each is installed, started and run."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.netns import Host

APT_TIMEOUT = 900.0
CACHE = Path("/var/cache/rackboot-bench")  # atftpd unpacked here (it conflicts with tftpd-hpa)
CLIENT_PACKAGES = ["atftp", "curl", "util-linux"]  # util-linux: taskset
PORTS = {"rackboot": 69, "tftpd-hpa": 1069, "atftpd": 2069}
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def apt(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, env=env,
                          timeout=APT_TIMEOUT)  # fmt: skip


def atftpd_binary(log=print) -> str:
    """atftpd from its .deb, unpacked (not installed: the package conflicts with tftpd-hpa)."""
    found = shutil.which("atftpd") or next(iter(glob.glob(f"{CACHE}/atftpd/usr/sbin/atftpd")), None)
    if found:
        return found
    log("unpacking Debian's atftpd into " + str(CACHE))
    (CACHE / "atftpd").mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["apt-get", "download", "atftpd"], cwd=CACHE, capture_output=True,
                         text=True, timeout=APT_TIMEOUT)  # fmt: skip
    if res.returncode != 0:
        apt("update")
        subprocess.run(
            ["apt-get", "download", "atftpd"], cwd=CACHE, check=True, timeout=APT_TIMEOUT
        )
    deb = sorted(CACHE.glob("atftpd_*.deb"))[-1]
    subprocess.run(["dpkg-deb", "-x", str(deb), str(CACHE / "atftpd")], check=True, timeout=60)
    return str(CACHE / "atftpd" / "usr" / "sbin" / "atftpd")


def add_client_addresses(host: Host, count: int) -> list[str]:
    """``count`` addresses on ``host``'s lab interface (its own first), one per
    concurrent client: from .100 of the lab's /24 on."""
    base = host.network.network_address
    extra = [str(base + 100 + i) for i in range(count - 1)]
    for addr in extra:
        subprocess.run(["ip", "-n", host.ns, "addr", "add", f"{addr}/{host.network.prefixlen}",
                        "dev", host.ifname], check=True, timeout=10)  # fmt: skip
    return [host.addr, *extra]


@dataclass
class Server:
    name: str
    port: int
    work: Path | None = None
    proc: subprocess.Popen | None = None
    extra: tuple[str, ...] = ()  # more [tftp] lines for rackboot ("busy_poll_us = 0")
    account: CpuAccount | None = None

    def argv(self, host: Host, root: Path, work: Path) -> list[str]:
        addr = host.addr
        if self.name == "tftpd-hpa":
            return ["in.tftpd", "--foreground", "--address", f"{addr}:{self.port}", "--secure",
                    "--user", "root", "--blocksize", "65464", str(root)]  # fmt: skip
        if self.name == "atftpd":
            return [atftpd_binary(), "--daemon", "--no-fork", "--bind-address", addr,
                    "--port", str(self.port), "--user", "root.root", "--maxthread", "200",
                    "--logfile", str(work / "atftpd.log"), str(root)]  # fmt: skip
        config = work / "rackboot.toml"
        config.write_text(
            # Only the tftp plugin: the others' services would share its vCPU.
            f'[plugins]\ndisabled = ["dhcp", "httpboot"]\n'
            f'[node]\nname = "bench"\ndata_dir = "{work / "data"}"\n'
            f'[tftp]\naddresses = ["{addr}"]\nport = {self.port}\nroot = "{root}"\n'
            "max_transfers = 1000\n" + "".join(f"{line}\n" for line in self.extra)
        )
        return [sys.executable, "-m", "appliance", "--log-level", "warning", "run",
                "--config", str(config)]  # fmt: skip

    def start(self, host: Host, root: Path, work: Path, cpu: str) -> None:
        log = (work / f"{self.name}.log").open("w")
        argv = ["taskset", "-c", cpu, *self.argv(host, root, work)]
        self.proc = host.popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env={**os.environ, "XDG_DATA_HOME": str(work / "xdg")})  # fmt: skip
        self.account = CpuAccount(f"rackboot-bench-tftp-{self.name}-{self.proc.pid}", self.proc.pid)
        if self.name == "rackboot":
            self._wait_rackboot(host, work)
        else:
            time.sleep(0.5)  # the peers say nothing when ready; the probe transfer checks them
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited: {(work / f'{self.name}.log').read_text()[-800:]}"
            )

    def _wait_rackboot(self, host: Host, work: Path) -> None:
        sock = work / "data" / "control.sock"
        for _ in range(300):
            res = host.run([sys.executable, "-m", "appliance", "status", "--json", "--socket",
                            str(sock)], timeout=10)  # fmt: skip
            if res.returncode == 0 and json.loads(res.stdout).get("tftp", {}).get("listening"):
                return
            if self.proc and self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"rackboot not ready: {(work / 'rackboot.log').read_text()[-800:]}")

    def wait_idle(self, host: Host, limit: float) -> float | None:
        """Wait (at most ``limit`` s) until the server holds no transfer: Rackboot's status
        shows none active or waiting; tftpd-hpa's cgroup holds only the parent. Seconds
        waited, or None when it could not tell (or did not get there in time)."""
        start = time.monotonic()
        while time.monotonic() - start < limit:
            if self._idle(host):
                return time.monotonic() - start
            time.sleep(0.5)
        return None

    def _idle(self, host: Host) -> bool:
        if self.name == "rackboot":
            sock = self.work / "data" / "control.sock"
            res = host.run([sys.executable, "-m", "appliance", "status", "--json", "--socket",
                            str(sock)], timeout=10)  # fmt: skip
            tftp = json.loads(res.stdout).get("tftp", {}) if res.returncode == 0 else {}
            return tftp.get("active_transfers") == 0 and tftp.get("waiting_requests", 0) == 0
        if self.account is None or self.account.path is None:
            return True  # cannot tell: the caller goes on
        procs = (self.account.path / "cgroup.procs").read_text().split()
        return len(procs) <= 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.account is not None:
            self.account.remove()


class CpuAccount:
    """CPU time of a server and everything it starts (threads, forked children, even
    those that have exited), from a cgroup-v1 ``cpuacct`` group of its own.

    Without one, tftpd-hpa's per-transfer children escape ``/proc/PID/stat``. Where
    no cpuacct hierarchy is mounted, ``seconds()`` is None and the figure is left out.
    """

    def __init__(self, name: str, pid: int) -> None:
        self.path: Path | None = CPUACCT / name
        try:
            self.path.mkdir()
            (self.path / "cgroup.procs").write_text(str(pid))
        except OSError:
            self.path = None

    def seconds(self) -> float | None:
        if self.path is None:
            return None
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()  # empty once the server and its children have exited
            except OSError:
                pass
            self.path = None


def client_argv(
    kind: str, server: Host, port: int, name: str, dest: Path, window: int, source: str = ""
) -> list[str]:
    if kind == "atftp":
        opts = ["--option", "blksize 1468", "--option", "tsize 0"]
        if window > 1:
            opts += ["--option", f"windowsize {window}"]
        return ["atftp", *opts, "-g", "-r", name, "-l", str(dest), server.addr, str(port)]
    bind = ["--interface", source] if source else []
    return ["curl", "-sS", "--fail", "--tftp-blksize", "1468", *bind, "-o", str(dest),
            f"tftp://{server.addr}:{port}/{name}"]  # fmt: skip
