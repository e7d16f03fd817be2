"""A ``rackboot run`` process in a lab namespace: its configuration written, started
and waited for until it serves, asked over its control socket, stopped or killed by
its PID. The lab's appliances (appliance/lab/rack.py) and the real tests' nodes."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from appliance import control
from appliance.errors import RackbootError
from appliance.lab.netns import Host, LabError
from appliance.lab.processes import rackboot, stop_process, wait_until


class NodeExited(LabError):
    """The node's process ended while it was expected to run (or stop cleanly)."""


class DhcpNode:
    """``rackboot run`` with DHCP on ``host``'s interface; ``dhcp`` is the rest of ``[dhcp]``."""

    def __init__(
        self,
        host: Host,
        workdir: Path,
        dhcp: str,
        *,
        name: str = "dhcp-node",
        interfaces: tuple[str, ...] = (),
        disabled: tuple[str, ...] = ("tftp", "httpboot"),
        node: str = "",
    ) -> None:
        """``interfaces``: where to serve (default: ``host``'s lab interface); ``node``:
        more keys of ``[node]``."""
        self.host = host
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.data = workdir / "data"
        self.socket = str(self.data / "control.sock")
        self.config = workdir / "rackboot.toml"
        self.log = workdir / "node.log"
        self.config.write_text(
            f'[node]\nname = "{name}"\ndata_dir = "{self.data}"\nshutdown_grace = 2.0\n{node}\n'
            f"[plugins]\ndisabled = {json.dumps(list(disabled))}\n\n"
            f"[dhcp]\ninterfaces = {json.dumps(list(interfaces or (host.ifname,)))}\n"
            + textwrap.dedent(dhcp)
        )
        self.proc: subprocess.Popen | None = None
        self.pids: list[int] = []  # every node process started, in order

    def start(self, timeout: float = 20.0, *, nofile: int | None = None,
              wrapper: tuple[str, ...] = ()) -> DhcpNode:  # fmt: skip
        """Start the node and wait until it serves DHCP. ``nofile``: its RLIMIT_NOFILE
        (1024 is what systemd gives a service unless told otherwise); ``wrapper``: a
        command that runs it (``setpriv ...``)."""
        env = {**os.environ, "XDG_DATA_HOME": str(self.workdir / "xdg")}

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with self.log.open("a") as out:
            self.proc = self.host.popen(
                [*wrapper, *rackboot("run", "--config", str(self.config))],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=self.workdir, preexec_fn=limit,
            )  # fmt: skip
        self.pids.append(self.proc.pid)
        wait_until(self._serving, timeout, f"rackboot node pid {self.proc.pid} serving DHCP",
                   detail=self.log_text)  # fmt: skip
        return self

    def _serving(self) -> bool:
        proc = self._started()
        if proc.poll() is not None:
            raise NodeExited(f"node exited {proc.returncode}:\n{self.log_text()}")
        try:
            status = control.call(self.socket, "status", timeout=2.0)
        except RackbootError:
            return False
        return bool(status.get("dhcp", {}).get("serving")) and self._ready(status)

    def _ready(self, status: dict[str, Any]) -> bool:
        """Beyond DHCP serving: what :meth:`start` waits for (a lone node is active)."""
        return status["core"]["role"] == "active"

    def call(self, cmd: str, args: dict[str, Any] | None = None) -> Any:
        return control.call(self.socket, cmd, args, timeout=5.0)

    def leases(self, *, all: bool = False) -> list[dict[str, Any]]:
        return self.call("dhcp.leases", {"all": all})

    def status(self) -> dict[str, Any]:
        return self.call("status")

    def metrics(self) -> str:
        return self.call("metrics")

    def cli(self, *args: str, as_json: bool = True) -> Any:
        """``rackboot ARGS [--json] --config FILE`` run in the node's namespace (parsed JSON,
        or the text)."""
        argv = rackboot(*args, *(["--json"] if as_json else []), "--config", str(self.config))
        res = self.host.run(argv, timeout=20)
        if res.returncode != 0:
            raise LabError(f"rackboot {' '.join(args)}: {res.stdout}{res.stderr}")
        return json.loads(res.stdout) if as_json else res.stdout

    def stop(self, timeout: float = 10.0) -> int:
        rc = stop_process(self._started(), signal.SIGTERM, timeout)
        if rc != 0:
            raise NodeExited(f"node exited {rc} on SIGTERM:\n{self.log_text()}")
        return rc

    def kill9(self) -> None:
        proc = self._started()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def _started(self) -> subprocess.Popen:
        if self.proc is None:
            raise LabError(f"{self.config}: the node was never started")
        return self.proc

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
