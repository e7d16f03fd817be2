"""Waiting on and stopping the lab's own processes: every wait has a deadline, every
signal goes to a child we started, by its PID."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from appliance.lab.netns import LabError

POLL = 0.02  # seconds between looks at an external process


class Timeout(LabError):
    """A deadline passed while waiting for an external process."""


def wait_until(
    check: Callable[[], Any], timeout: float, what: str, *, detail: Callable[[], str] = str
) -> Any:
    """Poll ``check`` until it returns something truthy; :class:`Timeout` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise Timeout(f"{what}: not within {timeout} s\n{detail()}")
        time.sleep(POLL)


def rackboot(*args: str) -> list[str]:
    """``rackboot ARGS`` from this very installation (the checkout ``rackboot lab`` runs from)."""
    return [sys.executable, "-m", "appliance", *args]


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
    """Signal our own child by PID and reap it; SIGKILL if it outlives ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.returncode
