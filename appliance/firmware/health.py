"""The health check a slot on trial must pass before it is marked good.

Healthy means: the node answers on its control socket and says it is ready
(every service started, so its sockets are bound); when it is a member of a
cluster with other appliances, at least one of them is reachable (online in
the site table); and every executable in ``[firmware] health_dir`` exits 0
(an image can add its own checks there; the update demonstration puts a
failing one into a bundle). :func:`wait_healthy` polls until all pass or the
deadline, whichever comes first.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.errors import RackbootError

POLL = 2.0  # seconds between rounds
HOOK_TIMEOUT = 60.0
MAX_HOOKS = 64

Status = Callable[[], dict[str, Any]]  # the node's `status` answer (raises when none answers)


def problems(status: Status, health_dir: Path) -> list[str]:
    """What stands between this boot and a good slot (empty: healthy)."""
    try:
        core = status().get("core", {})
    except (RackbootError, OSError, ValueError) as exc:
        return [f"node: {exc}", *hook_problems(health_dir)]
    found = [] if core.get("ready") else ["node: not ready (a service has not started)"]
    cluster = core.get("cluster") or {}
    peers = [p for p in cluster.get("site", []) if not p.get("self")]
    reachable = any(p.get("health") == "online" for p in peers)
    if cluster.get("state") == "member" and peers and not reachable:
        names = ", ".join(str(p.get("name")) for p in peers)
        found.append(f"cluster: no peer reachable ({names})")
    return found + hook_problems(health_dir)


def hook_problems(health_dir: Path) -> list[str]:
    try:
        names = sorted(os.listdir(health_dir))[:MAX_HOOKS]
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [f"{health_dir}: {exc.strerror}"]
    found = []
    for name in names:
        path = Path(health_dir) / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            continue
        try:
            done = subprocess.run([str(path)], capture_output=True, timeout=HOOK_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            found.append(f"{path}: {exc}")
            continue
        if done.returncode != 0:
            said = done.stdout.decode(errors="replace").strip()[-200:]
            found.append(f"{path}: exit {done.returncode}{': ' + said if said else ''}")
    return found


def wait_healthy(
    status: Status,
    health_dir: Path,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Poll until healthy (returns []) or ``timeout`` seconds passed (returns
    the last round's problems)."""
    deadline = clock() + timeout
    for _ in range(int(timeout / POLL) + 2):  # bounded whatever the clock does
        found = problems(status, health_dir)
        if not found or clock() >= deadline:
            return found
        sleep(min(POLL, max(0.0, deadline - clock())))
    return found
