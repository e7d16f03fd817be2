"""``python -m bench.dhcp --ha``: a Rackboot rack vs Kea's hot-standby pair, both replicating.

* ``rackboot-ha``: two appliances (``rackboot run``, DHCP on the lab link, ``[ha]``
  with a VIP, so the replicated state log is on) and a witness (``rackboot
  witness``), as tests/support/ha_lab.py starts them, with the benchmark's /16
  pool. perfdhcp broadcasts on the lab link; the active answers from the VIP, and
  an ACK leaves only once its lease record is durable on the active *and*
  acknowledged by the standby (docs/state.md, the commit rule).
* ``kea-ha``: two ``kea-dhcp4`` with ``libdhcp_ha.so`` in hot-standby and their
  ``kea-ctrl-agent`` (bench/failover/kea.py's configuration, same pool and lease
  time as Rackboot's): the primary sends each lease update to the standby over
  HTTP and answers once the standby acknowledged it.

Every server process of a side (both appliances and the witness; both
``kea-dhcp4`` and both ``kea-ctrl-agent``) is pinned to ``--server-cpu``,
perfdhcp to ``--client-cpu``. Each run starts the whole side fresh (Rackboot:
the data directories as enrolled, nothing else; Kea: empty lease files). After
each Rackboot run the active's and the standby's committed ``dhcp.leases`` are
compared (:meth:`RackHA.after_run`); during the run the appliances' and the
witness's election state is watched for a standby declared ineligible (the
active would then commit without it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from appliance import control
from appliance.errors import RackbootError
from bench.dhcp.servers import Server, ServerUnavailable, Subnet
from bench.failover.kea import KeaPair, agent_config, dhcp4_config, ha_state
from tests.support.dhcplab import Timeout, wait_until
from tests.support.ha_lab import HaNode, Rack
from tests.support.netns import Host, Lab, LabError

CATCH_UP_TIMEOUT = 60.0  # the standby taking in what the active committed, after the load
MONITOR_FILES_EVERY = 0.05  # the election state files, read from outside (no server CPU)
MONITOR_STATUS_EVERY = 0.5  # `ha.status` and `status` of the appliances (a little server CPU)


@contextlib.contextmanager
def pinned(cpus: str) -> Iterator[None]:
    """Children started meanwhile inherit this thread's CPU affinity: ``cpus`` (taskset list)."""
    wanted: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        wanted.update(range(int(lo), int(hi or lo) + 1))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, wanted)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def affinity(pid: int) -> set[str]:
    """The CPU lists of every thread of ``pid`` (one entry when all agree)."""
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    out.add(line.split(":", 1)[1].strip())
    return out


def proc_times(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of ``pid``, all threads, living and ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    hz = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / hz, int(fields[12]) / hz


def proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system, all threads, living and ended) of ``pid``."""
    times = proc_times(pid)
    return None if times is None else sum(times)


def ha_lab(prefix: str = "rbh") -> tuple[Lab, Subnet]:
    """A namespace lab whose link is the benchmark's /16 (its hosts get 10.X.0.N/16)."""
    lab = Lab(prefix=prefix)
    subnet = Subnet.for_second_octet(lab.network.network_address.packed[1])
    lab.network = subnet.network  # hosts added from now on are addressed in the /16
    return lab, subnet


class GroupServer(Server):
    """A side made of several processes: CPU is their sum, any exit during a run fails it."""

    def processes(self) -> dict[str, Any]:
        """name -> Popen of every server process of the side, running now."""
        raise NotImplementedError

    def cpu_seconds(self) -> float | None:
        procs = self.processes()
        if not procs:
            return None
        values = [proc_cpu(p.pid) for p in procs.values()]
        return None if any(v is None for v in values) else sum(values)  # type: ignore[misc]

    def load_started(self) -> None:
        """Called as perfdhcp starts: the baseline of :meth:`cpu_by_process`."""
        self._cpu0 = {name: proc_times(p.pid) for name, p in self.processes().items()}

    def cpu_by_process(self, part: int | None = None) -> dict[str, float | None]:
        """CPU seconds each server process used since :meth:`load_started` (``part``: 0 user
        time only, 1 system time only)."""
        base = getattr(self, "_cpu0", {})
        out: dict[str, float | None] = {}
        for name, p in self.processes().items():
            now, then = proc_times(p.pid), base.get(name)
            if now is None or then is None:
                out[name] = None
            else:
                parts = (0, 1) if part is None else (part,)
                out[name] = round(sum(now[i] - then[i] for i in parts), 3)
        return out

    def exited(self) -> str | None:
        for name, proc in self.processes().items():
            if proc.poll() is not None:
                return f"{self.name}: {name} exited ({proc.returncode}) during the run"
        return None

    def check_alive(self) -> None:
        why = self.exited()
        if why:
            raise ServerUnavailable(why, self.log)

    def failed_start(self, what: str, exc: BaseException) -> NoReturn:
        """Keep the logs, stop what started, and say why (ServerUnavailable as it came)."""
        self._save_logs()
        self.stop()
        if isinstance(exc, ServerUnavailable):
            raise exc
        raise ServerUnavailable(f"{what} did not start: {str(exc).splitlines()[0]}",
                                self.log) from None  # fmt: skip

    def _save_logs(self) -> None:
        raise NotImplementedError

    def check_pinned(self) -> None:
        """Every thread of every server process on ``--server-cpu``, or the run is void."""
        for name, proc in self.processes().items():
            lists = affinity(proc.pid)
            if lists and lists != {self.cpu}:
                raise ServerUnavailable(
                    f"{self.name}: {name} (pid {proc.pid}) runs on CPUs {sorted(lists)}, "
                    f"not {self.cpu}",
                    self.log,
                )


# -- Rackboot: two appliances and a witness ---------------------------------------------


class BenchRack(Rack):
    """tests/support/ha_lab.py's rack with the benchmark's pool: the /16's 10.X.1.0-10.X.255.250."""

    def __init__(self, lab: Lab, tmp_path: Path, subnet: Subnet) -> None:
        self.subnet = subnet
        # The lease time and conflict probe of the single-node benchmark (servers.py).
        super().__init__(lab, tmp_path, client_addr=True,
                         dhcp=f'lease_time = {subnet.lease_time}\nprobe = "none"\n')  # fmt: skip

    def _node(self, tmp_path: Path, name: str, names: tuple[str, ...]) -> HaNode:
        node = super()._node(tmp_path, name, names)
        net = self.lab.network
        old = f'pools = ["{net.network_address + 100}-{net.network_address + 150}"]'
        text = node.config.read_text()
        if old not in text:
            raise RuntimeError(
                f"tests/support/ha_lab.py no longer writes {old!r}: adjust BenchRack._node"
            )
        node.config.write_text(
            text.replace(old, f'pools = ["{self.subnet.pool_start}-{self.subnet.pool_end}"]')
        )
        return node


class ElectionWatch:
    """Watches, during the load, whether the active ever declared the standby ineligible.

    Two looks, both bounded by the run: the election state every member keeps on disk
    (``ha/state.json``: the set of appliances the last proposal it accepted declared
    ineligible), read from outside every 50 ms at no server CPU; and every 0.5 s the
    active's ``status`` (``state.replication``: whether its follower counts, its lag).
    """

    def __init__(self, files: dict[Path, str], active: HaNode, names: dict[str, str]) -> None:
        """``files``: election state file -> whose; ``names``: node id -> name."""
        self.files = files
        self.active = active
        self.names = names
        self.seen_ineligible: list[str] = []
        self.not_counted: int = 0
        self.max_lag = 0
        self.samples = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="election-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=10)
        return {
            "ineligible_seen": self.seen_ineligible[:20],
            "declarations": len(self.seen_ineligible),
            "status_samples": self.samples,
            "status_not_counted": self.not_counted,
            "max_follower_lag": self.max_lag,
            "status_errors": self.errors,
        }

    def _run(self) -> None:
        next_status = 0.0
        start = time.monotonic()
        current: dict[Path, set[str]] = {}
        while not self._stop.wait(MONITOR_FILES_EVERY):
            for path, whose in self.files.items():
                with contextlib.suppress(OSError, ValueError):
                    ids = set(json.loads(path.read_text()).get("ineligible") or [])
                    self.seen_ineligible += [  # each declaration once, as it appears
                        f"appliance {self.names.get(i, i)} declared, in {whose}'s acceptor "
                        f"at +{time.monotonic() - start:.1f} s of the load"
                        for i in sorted(ids - current.get(path, set()))
                    ]
                    current[path] = ids
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + MONITOR_STATUS_EVERY
                try:
                    rep = control.call(self.active.socket, "status", timeout=2.0)
                    followers = rep["core"]["state"]["replication"]["followers"]
                except (RackbootError, KeyError, TypeError):
                    self.errors += 1
                    continue
                self.samples += 1
                for f in followers.values():
                    self.max_lag = max(self.max_lag, int(f.get("lag") or 0))
                    if not f.get("counted", False):
                        self.not_counted += 1
                if not followers:
                    self.not_counted += 1


class RackHA(GroupServer):
    """A rack started fresh per run: the enrolled data directories, nothing else."""

    name = "rackboot-ha"
    ready_timeout = 90.0
    profilable = True

    def __init__(self, workdir: Path, subnet: Subnet, cpu: str, options: dict[str, Any],
                 rack: BenchRack) -> None:  # fmt: skip
        super().__init__(workdir, subnet, cpu, options)
        self.rack = rack
        self.log = self.dir / "rack.log"
        self.template = self.dir / "enrolled"
        self.dirs = {n: node.data for n, node in rack.nodes.items()}
        self.dirs["w"] = Path(str(rack.witness_config.parent / "w"))
        if not self.template.exists():
            for n, d in self.dirs.items():
                shutil.copytree(d, self.template / n, symlinks=True)
        self.active_name: str | None = None
        self.watch: ElectionWatch | None = None
        self.running = False

    @property
    def standby_name(self) -> str | None:
        return None if self.active_name is None else ("b" if self.active_name == "a" else "a")

    def processes(self) -> dict[str, Any]:
        if not self.running:
            return {}
        procs = {f"appliance-{n}": node.proc for n, node in self.rack.nodes.items()}
        procs["witness"] = self.rack.witness
        return {k: v for k, v in procs.items() if v is not None}

    def reset_state(self) -> None:
        for n, d in self.dirs.items():
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(self.template / n, d, symlinks=True)

    def start(self, srv: Host | None, cli: Host) -> None:
        self.stop()
        self.reset_state()
        self.starts += 1
        try:
            with pinned(self.cpu):
                self.running = True
                self.rack.start()
            actives = self.rack.actives()
            if len(actives) != 1:
                raise ServerUnavailable(f"rack has actives {actives} after start", self.log)
            self.active_name = actives[0]
            self.check_pinned()
            self.probe(cli, time.monotonic() + self.ready_timeout)
        except (LabError, AssertionError, ServerUnavailable) as exc:  # a Timeout, a node exited
            self.failed_start("rack", exc)

    def profile_pids(self) -> dict[str, int]:
        """The active and the standby: they share the server CPU, so both costs count."""
        out = {}
        for label, name in (("active", self.active_name), ("standby", self.standby_name)):
            proc = None if name is None else self.rack.nodes[name].proc
            if proc is not None:
                out[label] = proc.pid
        return out

    def load_started(self) -> None:
        super().load_started()
        assert self.active_name is not None
        base = self.rack.witness_config.parent
        files = {base / n / "data" / "ha" / "state.json": n for n in self.rack.nodes}
        files |= {path: "w" for path in (base / "w").glob("**/state.json")}
        names = {node_id: n for n, node_id in self.rack.ids.items()}
        self.watch = ElectionWatch(files, self.rack.nodes[self.active_name], names)
        self.watch.start()

    def after_run(self, srv: Host | None) -> dict[str, Any]:
        """Replication after the load: every lease the active committed is on the standby."""
        watch = self.watch.stop() if self.watch is not None else {}
        self.watch = None
        cpu = self.cpu_by_process()
        out: dict[str, Any] = {"active": self.active_name, "election": watch, "cpu_s": cpu,
                               "sys_s": self.cpu_by_process(1)}  # fmt: skip
        active = self.rack.nodes[self.active_name or "a"]
        standby = self.rack.nodes[self.standby_name or "b"]
        try:
            out["replication"] = self.verify(active, standby, watch)
            status = active.status()
            dhcp = status.get("dhcp", {})
            out["messages"] = dhcp.get("messages", {})
            out["store"] = dhcp.get("store", {})
            out["state"] = {k: v for k, v in status["core"]["state"].items()
                            if k in ("lsn", "durable", "keys", "writes", "failures",
                                     "compactions", "batches", "records")}  # fmt: skip
        except (RackbootError, KeyError, AssertionError, Timeout) as exc:
            out["replication"] = {"ok": False, "problem": f"could not verify: {exc}"}
        return out

    def verify(self, active: HaNode, standby: HaNode, watch: dict[str, Any]) -> dict[str, Any]:
        def lsn(node: HaNode) -> int:
            return int(node.status()["core"]["state"]["lsn"])

        at_end = {"active_lsn": lsn(active), "standby_lsn": lsn(standby)}

        def caught_up() -> bool:
            a, s = active.status(), standby.status()
            return (
                s["core"]["state"]["lsn"] >= a["core"]["state"]["lsn"]
                and a["dhcp"]["store"].get("pending", 0) == 0
                and s["dhcp"]["store"]["lsn"] >= a["dhcp"]["store"]["lsn"]
            )

        waited = time.monotonic()
        try:
            wait_until(caught_up, CATCH_UP_TIMEOUT, "the standby caught up")
        except Timeout:
            pass  # compared anyway: the mismatch says what is missing
        waited = time.monotonic() - waited
        on_active = {x["address"]: x for x in active.leases(all=True)}
        on_standby = {x["address"]: x for x in standby.leases(all=True)}
        keys = ("mac", "client", "state", "starts", "expires")
        missing = sorted(a for a in on_active if a not in on_standby)
        differ = sorted(
            a for a in on_active if a in on_standby
            and any(on_active[a][k] != on_standby[a][k] for k in keys)
        )  # fmt: skip
        extra = sorted(a for a in on_standby if a not in on_active)
        bound = sum(1 for x in on_active.values() if x["state"] == "bound")
        problems = []
        if missing:
            problems.append(f"{len(missing)} of the active's leases missing on the standby "
                            f"(e.g. {', '.join(missing[:3])})")  # fmt: skip
        if differ:
            problems.append(f"{len(differ)} leases differ (e.g. {differ[0]}: active "
                            f"{on_active[differ[0]]}, standby {on_standby[differ[0]]})")  # fmt: skip
        if extra:
            problems.append(f"{len(extra)} leases on the standby only (e.g. {extra[0]})")
        if watch.get("ineligible_seen"):
            problems.append("the standby was declared ineligible during the load, the active "
                            f"committing without it ({watch['declarations']} declarations seen "
                            f"in the acceptors' state; first: {watch['ineligible_seen'][0]})")  # fmt: skip
        if watch.get("status_not_counted"):
            problems.append(f"the active's follower did not count in {watch['status_not_counted']}"
                            f" of {watch['status_samples']} status samples")  # fmt: skip
        return {
            "ok": not problems,
            "problem": "; ".join(problems),
            "missing": len(missing),
            "differ": len(differ),
            "extra": len(extra),
            "declared": bool(watch.get("ineligible_seen") or watch.get("status_not_counted")),
            "active_leases": len(on_active),
            "active_bound": bound,
            "standby_leases": len(on_standby),
            "at_end_of_load": at_end,
            "catch_up_s": round(waited, 2),
        }

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self.watch = None
        if not self.running:
            return
        self.running = False
        self.active_name = None
        with contextlib.suppress(Exception):
            self._save_logs()
        self.rack.close()
        for name, host in self.rack.hosts.items():  # a VIP left behind would answer ARP
            if name in self.rack.nodes and self.rack.has_vip(name):
                host.run(["ip", "addr", "del", f"{self.rack.vip}/{host.network.prefixlen}",
                          "dev", host.ifname])  # fmt: skip

    def _save_logs(self) -> None:
        with self.log.open("a") as out:
            out.write(f"\n=== start {self.starts} ===\n{self.rack.logs()}\n")


# -- Kea: hot-standby pair with its control agents ---------------------------------------


class KeaHaPair(KeaPair):
    """bench/failover/kea.py's pair with the benchmark's pool, lease time and router option,
    every process under ``taskset -c CPU``."""

    def __init__(self, hosts: dict[str, Host], tmp: Path, subnet: Subnet, cpu: str) -> None:
        super().__init__(hosts, tmp, subnet.network)
        self.subnet = subnet
        self.cpu = cpu

    def dhcp4(self, side: str, work: Path) -> dict[str, Any]:
        config = dhcp4_config(side, self.hosts[side], self.hosts, work, self.network)
        s = self.subnet
        dhcp4 = config["Dhcp4"]
        dhcp4["valid-lifetime"] = s.lease_time
        dhcp4["multi-threading"] = {"enable-multi-threading": False}  # as the single Kea
        (subnet,) = dhcp4["subnet4"]
        subnet["pools"] = [{"pool": f"{s.pool_start} - {s.pool_end}"}]
        subnet["option-data"] = [{"name": "routers", "data": self.hosts["a"].addr}]
        return config

    def start(self) -> None:
        for side in ("a", "b"):
            host, work = self.hosts[side], self.tmp / f"kea-{side}"
            work.mkdir(parents=True, exist_ok=True)
            for old in work.glob("leases4.csv*"):
                old.unlink()
            for old in work.glob("*.pid"):
                old.unlink()
            (work / "dhcp4.json").write_text(json.dumps(self.dhcp4(side, work), indent=1))
            (work / "ca.json").write_text(json.dumps(agent_config(host, work), indent=1))
            env = {"KEA_PIDFILE_DIR": str(work), "KEA_LOCKFILE_DIR": str(work),
                   "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # fmt: skip
            for name, argv in ((f"ca_{side}", ["kea-ctrl-agent", "-c", str(work / "ca.json")]),
                               (f"kea_{side}", ["kea-dhcp4", "-c", str(work / "dhcp4.json")])):  # fmt: skip
                with (work / f"{name}.out").open("a") as out:
                    self.procs[name] = host.popen(
                        ["taskset", "-c", self.cpu, *argv], stdout=out,
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                    )  # fmt: skip
        wait_until(
            lambda: ha_state(self.hosts["a"]) == ha_state(self.hosts["b"]) == "hot-standby",
            60, "the Kea pair in hot-standby", detail=self.logs,
        )  # fmt: skip


class KeaHA(GroupServer):
    """Kea's hot-standby pair on the rack's two appliance hosts (run after, never with, it)."""

    name = "kea-ha"
    ready_timeout = 90.0

    def __init__(self, workdir: Path, subnet: Subnet, cpu: str, options: dict[str, Any],
                 hosts: dict[str, Host]) -> None:  # fmt: skip
        super().__init__(workdir, subnet, cpu, options)
        self.pair = KeaHaPair({"a": hosts["a"], "b": hosts["b"]}, self.dir, subnet, cpu)
        self.log = self.dir / "kea-ha.log"

    def processes(self) -> dict[str, Any]:
        return dict(self.pair.procs)

    def start(self, srv: Host | None, cli: Host) -> None:
        self.stop()
        self.starts += 1
        try:
            self.pair.start()
            self.check_pinned()
            self.probe(cli, time.monotonic() + self.ready_timeout)
        except (Timeout, AssertionError, ServerUnavailable) as exc:
            self.failed_start("Kea pair", exc)

    def profile_pids(self) -> dict[str, int]:
        return {}  # not Python: py-spy cannot tell its stacks

    def after_run(self, srv: Host | None) -> dict[str, Any]:
        out: dict[str, Any] = {"cpu_s": self.cpu_by_process(), "sys_s": self.cpu_by_process(1)}
        out["ha_state"] = {side: ha_state(self.pair.hosts[side]) for side in ("a", "b")}
        return out

    def stop(self) -> None:
        if self.pair.procs:
            with contextlib.suppress(Exception):
                self._save_logs()
        self.pair.stop()

    def _save_logs(self) -> None:
        with self.log.open("a") as out:
            out.write(f"\n=== start {self.starts} ===\n{self.pair.logs()}\n")
