"""The DHCP servers under test: Kea, dnsmasq and Rackboot, each started fresh per run.

Every instance runs inside the lab's server namespace, pinned with ``taskset``,
with its own configuration, lease, pid and log files in the run's temporary
directory. Nothing here touches a system service: a Kea or dnsmasq that apt
started on the host lives in the host's namespace and never sees our traffic.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.netns import Host

REPO = Path(__file__).resolve().parents[2]
STOP_TIMEOUT = 10.0
PROBE_WAIT = 5.0  # one probe attempt; dnsmasq's ping check delays its first OFFER ~3 s


class ServerUnavailable(RuntimeError):
    """The server did not start or did not become ready: ``summary`` says why, ``log`` shows it."""

    def __init__(self, summary: str, log: Path) -> None:
        self.summary = summary
        self.log_path = log
        self.tail = log_tail(log)
        last = [line.strip() for line in self.tail.splitlines() if line.strip()]
        self.last_log_line = last[-1] if last else ""
        super().__init__(f"{summary}; log {log}:\n{self.tail}")


@dataclass(frozen=True)
class Subnet:
    """The one subnet every server serves: a /16, so 50,000 clients fit the pool."""

    network: ipaddress.IPv4Network
    server: str  # the server's address (and router, DNS)
    client: str  # perfdhcp's address: it becomes giaddr
    pool_start: str
    pool_end: str
    lease_time: int = 3600

    @classmethod
    def for_second_octet(cls, octet: int) -> Subnet:
        net = ipaddress.IPv4Network(f"10.{octet}.0.0/16")
        base = int(net.network_address)
        addr = lambda off: str(ipaddress.IPv4Address(base + off))  # noqa: E731
        return cls(net, addr(1), addr(2), addr(256), addr(255 * 256 + 250))

    @property
    def pool_size(self) -> int:
        return (
            int(ipaddress.IPv4Address(self.pool_end))
            - int(ipaddress.IPv4Address(self.pool_start))
            + 1
        )


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    marker = text.rfind("\n=== start ")  # only the latest instance's lines
    if marker >= 0:
        text = text[marker:].split("\n", 2)[-1]
    tail = text.strip().splitlines()[-lines:]
    return "\n".join("    " + line for line in tail) or "    (empty log)"


class Server:
    """One server implementation. ``start`` leaves a fresh, ready instance or raises."""

    name = "?"
    ready_timeout = 15.0
    profilable = False  # --profile samples it (Rackboot)

    def __init__(self, workdir: Path, subnet: Subnet, cpu: str, options: dict[str, Any]) -> None:
        self.dir = workdir / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.subnet = subnet
        self.cpu = cpu
        self.options = options
        self.proc: subprocess.Popen | None = None
        self.log = self.dir / f"{self.name}.log"
        self.starts = 0
        self.probe_result = ""

    # -- to be provided by each server ---------------------------------------

    def reset_state(self) -> None:
        """Remove leases and pid files of the previous run: every run starts empty."""

    def argv(self, srv: Host) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def wait_started(self, srv: Host, deadline: float) -> None:
        """Server-specific readiness before the DORA probe (default: none)."""

    def after_run(self, srv: Host) -> dict[str, Any]:
        """Server-specific counters read after the load, before the server stops."""
        return {}

    def load_started(self) -> None:
        """Called just before perfdhcp starts (a grouped server takes its baselines)."""

    def exited(self) -> str | None:
        """Why the run is void because the server went away during it, or None."""
        if self.proc is not None and self.proc.poll() is not None:
            return f"{self.name} exited ({self.proc.returncode}) during the run"
        return None

    def profile_pids(self) -> dict[str, int]:
        """The processes ``--profile py-spy`` samples, by label ("" for the only one)."""
        return {} if self.proc is None else {"": self.proc.pid}

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system, all threads) the running server has used so far."""
        if self.proc is None:
            return None
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rfind(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    # -- common ---------------------------------------------------------------

    def start(self, srv: Host, cli: Host) -> None:
        self.stop()
        self.reset_state()
        self.starts += 1
        with self.log.open("a") as out:
            out.write(f"\n=== start {self.starts} ===\n")
            out.flush()
            self.proc = srv.popen(
                ["taskset", "-c", self.cpu, *self.argv(srv)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.env(), cwd=self.dir,
            )  # fmt: skip
        deadline = time.monotonic() + self.ready_timeout
        try:
            self.wait_started(srv, deadline)
            self.probe(cli, deadline)
        except ServerUnavailable:
            self.stop()
            raise

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise ServerUnavailable(
                f"{self.name} exited with status {self.proc.returncode} while starting", self.log
            )

    def probe(self, cli: Host, deadline: float) -> None:
        """One DORA shaped like perfdhcp's (bench.dhcp.probe), retried: bounded in count and time."""
        argv = [sys.executable, "-m", "bench.dhcp.probe", cli.addr, str(PROBE_WAIT)]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        last = ""
        for _ in range(50):
            self.check_alive()
            res = cli.run(argv, timeout=PROBE_WAIT + 10, env=env, cwd=REPO)
            last = (res.stdout + res.stderr).strip().splitlines()[-1:] or [f"exit {res.returncode}"]
            last = last[0]
            if res.returncode == 0:
                self.probe_result = last
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        raise ServerUnavailable(
            f"{self.name} did not complete one relayed DORA within {self.ready_timeout:.0f} s "
            f"(last probe: {last})",
            self.log,
        )

    def stop(self) -> None:
        """Stop the instance we started, by its PID only (SIGTERM, then SIGKILL)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT)


class Kea(Server):
    """ISC Kea 2.x kea-dhcp4: memfile with persist true and lfc-interval 0, single-threaded."""

    name = "kea"

    def reset_state(self) -> None:
        for p in self.dir.glob("leases4.csv*"):
            p.unlink()
        for p in self.dir.glob("*.pid"):
            p.unlink()

    def config(self, iface: str) -> dict[str, Any]:
        s = self.subnet
        return {
            "Dhcp4": {
                # raw sockets: kea sees the interface like on a real rack port
                "interfaces-config": {"interfaces": [iface], "dhcp-socket-type": "raw"},
                "lease-database": {
                    "type": "memfile",
                    "persist": True,
                    "name": str(self.dir / "leases4.csv"),
                    "lfc-interval": 0,
                },
                "multi-threading": {"enable-multi-threading": False},
                "valid-lifetime": s.lease_time,
                "subnet4": [
                    {
                        "id": 1,
                        "subnet": str(s.network),
                        "pools": [{"pool": f"{s.pool_start} - {s.pool_end}"}],
                        "option-data": [
                            {"name": "routers", "data": s.server},
                            {"name": "domain-name-servers", "data": s.server},
                        ],
                    }
                ],
                "loggers": [
                    {
                        "name": "kea-dhcp4",
                        "output_options": [{"output": str(self.dir / "kea-dhcp4.log")}],
                        "severity": "WARN",
                    }
                ],
            }
        }

    def argv(self, srv: Host) -> list[str]:
        path = self.dir / "kea-dhcp4.json"
        path.write_text(json.dumps(self.config(srv.ifname), indent=2))
        return ["kea-dhcp4", "-c", str(path)]

    def env(self) -> dict[str, str]:
        # Our own pid and lock files: never the system instance's /run/kea.
        return {**os.environ, "KEA_PIDFILE_DIR": str(self.dir), "KEA_LOCKFILE_DIR": str(self.dir)}


class Dnsmasq(Server):
    """dnsmasq as a DHCP server only (port=0: no DNS), with ``no-ping``.

    As shipped, dnsmasq pings an address before offering it and waits up to 3 s
    for an echo *without serving DHCP meanwhile* (up to 6 such pings per 30 s).
    perfdhcp counts an answer later than 1 s as lost, so with the ping dnsmasq
    sustains no rate at all; :class:`DnsmasqPing` measures that variant.
    """

    name = "dnsmasq"
    ping = False

    def reset_state(self) -> None:
        (self.dir / "dnsmasq.leases").write_text("")
        (self.dir / "dnsmasq.pid").unlink(missing_ok=True)

    def config(self, iface: str) -> str:
        s = self.subnet
        lines = [
            "port=0",  # DHCP only
            f"interface={iface}",
            "bind-interfaces",
            "no-resolv",
            "no-hosts",
            "dhcp-authoritative",
            f"dhcp-range={s.pool_start},{s.pool_end},{s.network.netmask},{s.lease_time}",
            f"dhcp-option=option:router,{s.server}",
            f"dhcp-option=option:dns-server,{s.server}",
            f"dhcp-lease-max={s.pool_size}",  # the default (1000) would refuse most clients
            f"dhcp-leasefile={self.dir / 'dnsmasq.leases'}",
            f"pid-file={self.dir / 'dnsmasq.pid'}",
            f"log-facility={self.dir / 'dnsmasq-daemon.log'}",
            "quiet-dhcp",  # no log line per packet (Kea logs at WARN, Rackboot at warning)
            "user=root",  # lease file in our temp dir
        ]
        if not self.ping:
            lines.append("no-ping")  # no ICMP probe of an address before offering it
        return "\n".join(lines) + "\n"

    def argv(self, srv: Host) -> list[str]:
        path = self.dir / "dnsmasq.conf"
        path.write_text(self.config(srv.ifname))
        return ["dnsmasq", "--keep-in-foreground", f"--conf-file={path}"]


class DnsmasqPing(Dnsmasq):
    """dnsmasq as shipped: ping check before each offer (blocking, up to 3 s)."""

    name = "dnsmasq-ping"
    ping = True


def render_rackboot_config(data_dir: Path, iface: str, subnet: Subnet) -> str:
    """The Rackboot TOML for the run. The one place to adjust when the dhcp schema changes.

    Only the dhcp plugin runs (Kea and dnsmasq serve DHCP alone too): the tftp
    plugin would bind port 69 and create its root directory on the host. The
    conflict probe stays off (``probe = "none"``, the default), as with
    dnsmasq's ``no-ping``. Leases are journalled and fdatasync'ed per group
    commit before any ACK leaves, as always: there is no switch to turn that off.
    """
    s = subnet
    return f"""\
[node]
name = "bench"
data_dir = "{data_dir}"

[plugins]
disabled = ["tftp", "httpboot"]

[dhcp]
interfaces = ["{iface}"]
lease_time = {s.lease_time}
probe = "none"

[[dhcp.subnets]]
network = "{s.network}"
pools = ["{s.pool_start}-{s.pool_end}"]
router = "{s.server}"
dns = ["{s.server}"]
"""


class Rackboot(Server):
    """Our node (``python -m appliance run``), ready once ``status --json`` shows DHCP serving.

    ``options["profile"] == "cprofile"`` runs it under ``python -m cProfile``
    (output ``rackboot-<start>.pstats`` in its directory); py-spy attaches from
    outside (bench.dhcp.cli) and needs nothing here.
    """

    name = "rackboot"
    ready_timeout = 30.0
    profilable = True
    no_service_grace = 5.0  # node answers, but no dhcp service shows up: plugin missing

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def config_path(self) -> Path:
        return self.dir / "rackboot.toml"

    def reset_state(self) -> None:
        if self.data_dir.exists():
            import shutil

            shutil.rmtree(self.data_dir)

    def argv(self, srv: Host) -> list[str]:
        self.config_path.write_text(render_rackboot_config(self.data_dir, srv.ifname, self.subnet))
        self.check_config()
        python = [sys.executable]
        if self.options.get("profile") == "cprofile":
            python += ["-m", "cProfile", "-o", str(self.pstats_path(self.starts))]
        return [
            *python, "-m", "appliance", "--log-level", "warning",
            "run", "--config", str(self.config_path),
        ]  # fmt: skip

    def pstats_path(self, start: int) -> Path:
        return self.dir / f"rackboot-{start}.pstats"

    def check_config(self) -> None:
        """`rackboot config check` on the rendered file: a schema change names the key at once."""
        argv = [sys.executable, "-m", "appliance", "config", "check", str(self.config_path)]
        res = subprocess.run(
            argv, capture_output=True, text=True, env=self.env(), cwd=self.dir, timeout=60
        )
        if res.returncode != 0:
            with self.log.open("a") as log:
                log.write(f"{self.config_path}:\n{self.config_path.read_text()}\n")
                log.write(res.stdout + res.stderr)
            raise ServerUnavailable(
                "rackboot rejects the configuration render_rackboot_config() wrote "
                "(bench/dhcp/servers.py): "
                + ((res.stderr or res.stdout).strip().splitlines() or ["?"])[-1],
                self.log,
            )

    def env(self) -> dict[str, str]:
        env = {**os.environ, "XDG_DATA_HOME": str(self.dir / "xdg")}  # never the user's dir
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        return env

    def status(self, srv: Host) -> dict[str, Any] | None:
        """`rackboot status --json` of the running node, or None if it does not answer."""
        sock = self.data_dir / "control.sock"
        if not sock.exists():
            return None
        argv = [sys.executable, "-m", "appliance", "status", "--json", "--socket", str(sock)]
        try:
            res = srv.run(argv, timeout=10, env=self.env(), cwd=self.dir)
        except subprocess.TimeoutExpired:
            return None
        if res.returncode != 0:
            return {"error": (res.stderr.strip().splitlines() or ["?"])[-1]}
        try:
            return json.loads(res.stdout)
        except json.JSONDecodeError:
            return {"error": "status --json printed no JSON"}

    def wait_started(self, srv: Host, deadline: float) -> None:
        """Poll `rackboot status --json` until ``dhcp.serving`` and its service runs (bounded)."""
        answered_at: float | None = None
        last = "no answer yet"
        for _ in range(300):
            self.check_alive()
            status = self.status(srv)
            if status is not None and "error" not in status:
                services = status.get("core", {}).get("services", {})
                dhcp_services = {k: v for k, v in services.items() if k.split(".")[0] == "dhcp"}
                dhcp = status.get("dhcp", {})
                if (
                    dhcp.get("serving")
                    and dhcp.get("answering_pools", True)
                    and dhcp_services
                    and all(v == "running" for v in dhcp_services.values())
                ):
                    return
                if any(v == "failed" for v in dhcp_services.values()):
                    raise ServerUnavailable(
                        f"rackboot dhcp service failed: {dhcp_services}", self.log
                    )
                now = time.monotonic()
                answered_at = answered_at or now
                last = f"services {services or '{}'}, dhcp {dhcp or '{}'}"
                if not dhcp_services and now - answered_at > self.no_service_grace:
                    raise ServerUnavailable(
                        f"rackboot node runs but has no dhcp service ({last}): "
                        "is the dhcp plugin installed?",
                        self.log,
                    )
            elif status is not None:
                last = status["error"]
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        raise ServerUnavailable(
            f"rackboot not ready within {self.ready_timeout:.0f} s ({last})", self.log
        )

    # The state log's counters in `rackboot status --json` (appliance/state/store.py
    # StateStore.status, under "core" -> "state"): ``writes`` counts group commits (one write
    # and one fdatasync each, by the log's writer thread) and ``durable`` is the last
    # LSN on disk, so its growth is the records those writes carried.
    LOG_COUNTERS = ("writes", "durable", "write_failures")
    log_before: dict[str, int] | None = None

    def load_started(self) -> None:
        """The state log's counters just before perfdhcp starts (after the node's start-up
        and the probe's DORA), so that :meth:`after_run` counts the run's writes alone.
        Asked in-process over the control socket (a path, reachable from any network
        namespace): a ``rackboot status`` process would delay the load by its start-up."""
        self.log_before = self._log_counters(self._status_here())

    def _status_here(self) -> dict[str, Any] | None:
        from appliance import control
        from appliance.errors import RackbootError

        try:
            return control.call(str(self.data_dir / "control.sock"), "status", timeout=5.0)
        except (RackbootError, OSError):
            return None

    @classmethod
    def _log_counters(cls, status: dict[str, Any] | None) -> dict[str, int] | None:
        state = ((status or {}).get("core") or {}).get("state") or {}
        if not all(isinstance(state.get(k), int) for k in cls.LOG_COUNTERS):
            return None
        return {k: state[k] for k in cls.LOG_COUNTERS}

    def after_run(self, srv: Host) -> dict[str, Any]:
        """The state log's group commits and the message counters of the run, read before
        the node is stopped. ``state_log``: ``batches`` (writes, each one write + fdatasync)
        and ``records`` (LSNs made durable by them) during the load, or since the node
        started (``since: "start"``) when the counters before the load could not be read;
        empty when the node did not answer."""
        status = self._status_here() or {}
        after = self._log_counters(status)
        before, self.log_before = self.log_before, None
        log: dict[str, Any] = {}
        if after is not None:
            since, base = ("load", before) if before else ("start", dict.fromkeys(after, 0))
            log = {
                "batches": after["writes"] - base["writes"],
                "records": after["durable"] - base["durable"],
                "write_failures": after["write_failures"] - base["write_failures"],
                "since": since,
            }
        dhcp = status.get("dhcp", {})
        return {"state_log": log, "messages": dhcp.get("messages", {})}


SERVERS: dict[str, type[Server]] = {
    "kea": Kea,
    "dnsmasq": Dnsmasq,
    "dnsmasq-ping": DnsmasqPing,
    "rackboot": Rackboot,
}
