"""A ``rackboot run`` process started in a lab namespace: wait until a plugin listens."""

from __future__ import annotations

import json
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
