"""Kea 2.2's hot-standby pair in the same namespaces, for the same failover measurement.

Each side runs ``kea-dhcp4`` (``libdhcp_ha.so`` + ``libdhcp_lease_cmds.so``,
memfile, raw sockets) and ``kea-ctrl-agent`` (the peers talk through it).
Timers are Kea's most aggressive legal ones: heartbeat 1 s, max-response-delay
2 s, max-unacked-clients 0 (with its defaults the gap is about a minute). Per
trial the pair starts fresh, both reach ``hot-standby``, the primary's
``kea-dhcp4`` is killed with SIGKILL at a random moment of the heartbeat
period, and the gap is from the kill to the first OFFER from the standby
(the reply's Ethernet source, as for Rackboot; Kea's servers each name their
own address, which would tell them apart too).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from tests.support.dhcplab import stop_process, wait_until
from tests.support.netns import Host

HOOKS = Path("/usr/lib/x86_64-linux-gnu/kea/hooks")
TIMERS = {"heartbeat-delay": 1000, "max-response-delay": 2000, "max-ack-delay": 10000,
          "max-unacked-clients": 0}  # fmt: skip


def dhcp4_config(side: str, host: Host, hosts: dict[str, Host], work: Path, network) -> dict:
    peers = [
        {"name": f"server-{n}", "url": f"http://{hosts[n].addr}:8000/",
         "role": "primary" if n == "a" else "standby", "auto-failover": True}
        for n in ("a", "b")
    ]  # fmt: skip
    base = network.network_address
    return {"Dhcp4": {
        "interfaces-config": {"interfaces": [host.ifname], "dhcp-socket-type": "raw"},
        "control-socket": {"socket-type": "unix", "socket-name": str(work / "kea4.sock")},
        "lease-database": {"type": "memfile", "persist": True,
                           "name": str(work / "leases4.csv"), "lfc-interval": 0},
        "valid-lifetime": 600,
        "hooks-libraries": [
            {"library": str(HOOKS / "libdhcp_lease_cmds.so")},
            {"library": str(HOOKS / "libdhcp_ha.so"), "parameters": {"high-availability": [{
                "this-server-name": f"server-{side}", "mode": "hot-standby", **TIMERS,
                "multi-threading": {"enable-multi-threading": False},
                "peers": peers}]}},
        ],
        "subnet4": [{"id": 1, "subnet": str(network),
                     "pools": [{"pool": f"{base + 100} - {base + 150}"}]}],
        "loggers": [{"name": "kea-dhcp4", "severity": "WARN",
                     "output_options": [{"output": str(work / "kea.log")}]}],
    }}  # fmt: skip


def agent_config(host: Host, work: Path) -> dict:
    return {"Control-agent": {
        "http-host": host.addr, "http-port": 8000,
        "control-sockets": {"dhcp4": {"socket-type": "unix",
                                      "socket-name": str(work / "kea4.sock")}},
        "loggers": [{"name": "kea-ctrl-agent", "severity": "WARN",
                     "output_options": [{"output": str(work / "ca.log")}]}],
    }}  # fmt: skip


def ha_state(host: Host) -> str:
    command = json.dumps({"command": "ha-heartbeat", "service": ["dhcp4"]})
    res = host.run(["curl", "-s", "-m", "2", "-X", "POST", "-H", "Content-Type: application/json",
                    "-d", command, f"http://{host.addr}:8000/"])  # fmt: skip
    try:
        return json.loads(res.stdout)[0]["arguments"]["state"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "none"


class KeaPair:
    def __init__(self, hosts: dict[str, Host], tmp: Path, network) -> None:
        self.hosts = hosts
        self.tmp = tmp
        self.network = network
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        for side in ("a", "b"):
            host, work = self.hosts[side], self.tmp / f"kea-{side}"
            work.mkdir(parents=True, exist_ok=True)
            (work / "leases4.csv").unlink(missing_ok=True)
            (work / "dhcp4.json").write_text(
                json.dumps(dhcp4_config(side, host, self.hosts, work, self.network))
            )
            (work / "ca.json").write_text(json.dumps(agent_config(host, work)))
            env = {
                "KEA_PIDFILE_DIR": str(work),
                "KEA_LOCKFILE_DIR": str(work),
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            }
            for name, argv in ((f"ca_{side}", ["kea-ctrl-agent", "-c", str(work / "ca.json")]),
                               (f"kea_{side}", ["kea-dhcp4", "-c", str(work / "dhcp4.json")])):  # fmt: skip
                with (work / f"{name}.out").open("w") as out:
                    self.procs[name] = host.popen(
                        argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env=env,
                    )  # fmt: skip
        wait_until(
            lambda: ha_state(self.hosts["a"]) == ha_state(self.hosts["b"]) == "hot-standby",
            60, "the Kea pair in hot-standby", detail=self.logs,
        )  # fmt: skip

    def kill_primary(self) -> None:
        proc = self.procs.pop("kea_a")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                stop_process(proc, signal.SIGTERM, 5)
        self.procs.clear()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.parent.name}/{p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(self.tmp.glob("kea-*/*.out")) + sorted(self.tmp.glob("kea-*/*.log"))
        )


def kill_trial(pair: KeaPair, first_offer_after, rng) -> float:
    pair.start()
    try:
        time.sleep(rng.uniform(2.0, 3.0))  # a random moment of the 1 s heartbeat period
        killed = time.monotonic()
        pair.kill_primary()
        at = wait_until(lambda: first_offer_after(killed), 30, "an OFFER from Kea's standby",
                        detail=pair.logs)  # fmt: skip
        return at - killed
    finally:
        pair.stop()
