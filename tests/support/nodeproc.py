"""A ``rackboot run`` process in a lab namespace: start it, wait until a plugin listens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.netns import Host


def wait_listening(
    host: Host, sock: Path, proc: subprocess.Popen, log: Path, plugin: str, timeout: float = 20.0
) -> None:
    """Poll ``rackboot status`` over ``sock`` until ``plugin`` reports its listening
    addresses; RuntimeError with the node's log if it exits or is not ready in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"node exited {proc.returncode}:\n{log.read_text()[-2000:]}")
        res = host.run([sys.executable, "-m", "appliance", "status", "--json", "--socket", str(sock)],
                       timeout=10)  # fmt: skip
        if res.returncode == 0 and json.loads(res.stdout).get(plugin, {}).get("listening"):
            return
        time.sleep(0.05)
    raise RuntimeError(f"node not ready within {timeout} s:\n{log.read_text()[-2000:]}")


def start_node(
    host: Host, config: Path, sock: Path, work: Path, plugin: str, *, prefix: tuple[str, ...] = ()
) -> subprocess.Popen:
    """``rackboot run --config CONFIG`` in ``host``'s namespace (``prefix``: e.g. taskset),
    its output in ``work/node.log``, state under ``work``; returns once ``plugin`` listens.
    The lab stops it at close (by its PID)."""
    log = work / "node.log"
    env = {**os.environ, "XDG_DATA_HOME": str(work / "xdg")}
    with log.open("w") as out:
        proc = host.popen(
            [*prefix, sys.executable, "-m", "appliance", "run", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=work,
        )  # fmt: skip
    wait_listening(host, sock, proc, log, plugin)
    return proc
