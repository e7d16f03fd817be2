"""The two things the CLIs ask: a Rackboot development node and a Kea (kea-dhcp4 with
the lease commands, behind kea-ctrl-agent), both on loopback only, each holding the
same number of leases. Started and stopped by their PIDs; every wait bounded."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path

from plugins.dhcp.testclient import DhcpClient
from tests.support.dhcplab import stop_process

HOOKS = Path("/usr/lib/x86_64-linux-gnu/kea/hooks")
START_TIMEOUT = 30.0
RACKBOOT = str(Path(sys.executable).with_name("rackboot"))  # the script an operator runs


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check, what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench.cli: {what} not ready within {timeout} s")
        time.sleep(0.05)


class RackbootNode:
    """``rackboot run --config FILE``: DHCP on a free loopback port, TFTP and HTTP on ports
    the kernel picks, its data in the work directory."""

    def __init__(self, work: Path) -> None:
        self.config = work / "rackboot.toml"
        self.port = free_port(socket.SOCK_DGRAM)
        self.config.write_text(
            f'[node]\nname = "bench-cli"\ndata_dir = "{work / "data"}"\n\n'
            f"[dhcp]\nport = {self.port}\n\n[tftp]\nport = 0\n\n[httpboot]\nport = 0\n"
        )
        self.log = open(work / "node.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen([RACKBOOT, "run", "--dev", "--config", str(self.config)],
                                     stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        wait_until(self._answers, "the Rackboot node")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise SystemExit(f"bench.cli: the node exited {self.proc.returncode}")
        probe = subprocess.run([RACKBOOT, "status", "--json", "--config", str(self.config)],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
        return probe.returncode == 0 and json.loads(probe.stdout)["core"]["ready"]

    def add_leases(self, count: int) -> None:
        node = types.SimpleNamespace(config={"dhcp": types.SimpleNamespace(port=self.port)})
        client = DhcpClient(node)
        for n in range(count):
            client.dora(f"52:54:00:00:{n >> 8:02x}:{n & 0xFF:02x}")

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


class Kea:
    """kea-dhcp4 (memfile in memory, no interface: it answers its control socket only)
    and kea-ctrl-agent on a free loopback port, as kea-shell expects."""

    def __init__(self, work: Path) -> None:
        self.port = free_port(socket.SOCK_STREAM)
        sock = work / "kea4.sock"
        dhcp4 = {"Dhcp4": {
            "interfaces-config": {"interfaces": []},
            "control-socket": {"socket-type": "unix", "socket-name": str(sock)},
            "lease-database": {"type": "memfile", "persist": False},
            "hooks-libraries": [{"library": str(HOOKS / "libdhcp_lease_cmds.so")}],
            "subnet4": [{"id": 1, "subnet": "192.0.2.0/24",
                         "pools": [{"pool": "192.0.2.10 - 192.0.2.250"}]}],
            "loggers": [{"name": "kea-dhcp4", "severity": "WARN",
                         "output_options": [{"output": str(work / "kea-dhcp4.log")}]}],
        }}  # fmt: skip
        agent = {"Control-agent": {
            "http-host": "127.0.0.1", "http-port": self.port,
            "control-sockets": {"dhcp4": {"socket-type": "unix", "socket-name": str(sock)}},
            "loggers": [{"name": "kea-ctrl-agent", "severity": "WARN",
                         "output_options": [{"output": str(work / "kea-ctrl-agent.log")}]}],
        }}  # fmt: skip
        (work / "kea-dhcp4.json").write_text(json.dumps(dhcp4))
        (work / "kea-ctrl-agent.json").write_text(json.dumps(agent))
        env = {**os.environ, "KEA_PIDFILE_DIR": str(work), "KEA_LOCKFILE_DIR": str(work)}
        self.procs = [
            subprocess.Popen(["kea-dhcp4", "-c", str(work / "kea-dhcp4.json")], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            subprocess.Popen(["kea-ctrl-agent", "-c", str(work / "kea-ctrl-agent.json")], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        ]  # fmt: skip
        wait_until(lambda: self._command("status-get")[0]["result"] == 0, "Kea")

    def _command(self, command: str, arguments: dict | None = None) -> list[dict]:
        for proc in self.procs:
            if proc.poll() is not None:
                raise SystemExit(f"bench.cli: {proc.args[0]} exited {proc.returncode}")
        body = {
            "command": command,
            "service": ["dhcp4"],
            **({"arguments": arguments} if arguments else {}),
        }
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/", json.dumps(body).encode(),
                                         {"content-type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return json.loads(reply.read())
        except OSError:
            return [{"result": -1}]

    def add_leases(self, count: int) -> None:
        for n in range(count):
            arguments = {"ip-address": f"192.0.2.{10 + n}", "hw-address": f"52:54:00:00:{n >> 8:02x}:{n & 0xFF:02x}",
                         "subnet-id": 1, "valid-lft": 3600}  # fmt: skip
            answer = self._command("lease4-add", arguments)[0]
            if answer["result"] != 0:
                raise SystemExit(f"bench.cli: Kea refused lease4-add: {answer}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)
