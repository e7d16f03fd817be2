"""The health check a slot on trial must pass before it is marked good.

Healthy means: the node answers on its control socket and says it is ready
(every service started, so its sockets are bound); when it is a member of a
cluster with other appliances, at least one of them is reachable (online in
the site table); and every executable in ``[firmware] health_dir`` exits 0
(an image can add its own checks there; the update demonstration puts a
failing one into a bundle). :func:`wait_healthy` polls until all pass or the
deadline, whichever comes first: a node still starting, a peer not yet reached
may come right.

Some failures waiting cannot fix, and they end the wait at once: this slot's code
refuses the configuration (:func:`refused_configuration`: what ``rackboot config
check`` says), or the node's service keeps exiting (:func:`service_gave_up`:
systemd gave up restarting it, or it exited :data:`MAX_EXITS` times since boot).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.errors import RackbootError

POLL = 2.0  # seconds between rounds
HOOK_TIMEOUT = 60.0
MAX_HOOKS = 64
MAX_EXITS = 3  # the node's service exited this often since boot: it will not come up
UNIT = "rackboot.service"
UNIT_PROPERTIES = ("ActiveState", "Result", "ExecMainStatus", "NRestarts")

Status = Callable[[], dict[str, Any]]  # the node's `status` answer (raises when none answers)
Definite = Callable[[], list[str]]  # failures that end the wait at once (empty: none)


@dataclass(frozen=True)
class Verdict:
    problems: list[str]  # empty: healthy
    definite: bool = False  # the wait ended early: waiting would not have helped


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
    definite: Definite = list,
) -> Verdict:
    """Poll until healthy, a definite failure (``definite()`` says something: the
    verdict is given at once) or ``timeout`` seconds passed (the last round's problems)."""
    deadline = clock() + timeout
    for _ in range(int(timeout / POLL) + 2):  # bounded whatever the clock does
        final = definite()
        if final:
            return Verdict(final, definite=True)
        found = problems(status, health_dir)
        if not found or clock() >= deadline:
            return Verdict(found)
        sleep(min(POLL, max(0.0, deadline - clock())))
    return Verdict(found)


def refused_configuration(path: str) -> list[str]:
    """What ``rackboot config check`` refuses in ``path``, run by this slot's code: a
    configuration the new version does not accept will not come right by waiting."""
    from appliance.loader import ConfigSource, load, preflight

    try:
        config, _ = load(ConfigSource(path, dev=False))
        preflight(config)
    except RackbootError as exc:  # ConfigError, PluginError: what the node would exit on
        return [f"configuration refused by this version: {exc}"]
    return []


def service_gave_up(show: Callable[[], dict[str, str]]) -> list[str]:
    """The node's service, as systemd shows it (``show()``: :data:`UNIT_PROPERTIES`),
    has stopped for good: failed (systemd gave up restarting it) or exited
    :data:`MAX_EXITS` times since boot. A node that exited once may restart fine."""
    unit = show()
    exits = int(unit.get("NRestarts") or 0) if (unit.get("NRestarts") or "0").isdigit() else 0
    # Between two restarts systemd shows the new attempt's (Result=success, status 0)
    result = unit.get("Result", "")
    last = f" ({result}, status {unit.get('ExecMainStatus', '?')})" if result != "success" else ""
    if unit.get("ActiveState") == "failed":
        return [f"node: {UNIT} failed{last}; systemd does not restart it"]
    if exits >= MAX_EXITS:
        return [f"node: {UNIT} exited {exits} times since boot{last}"]
    return []


def systemd_show(run: Callable[..., Any] = subprocess.run) -> dict[str, str]:
    """The unit's :data:`UNIT_PROPERTIES` (empty when systemd cannot say)."""
    argv = ["systemctl", "show", UNIT, *(f"--property={p}" for p in UNIT_PROPERTIES)]
    try:
        done = run(argv, check=False, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    pairs = (line.partition("=") for line in done.stdout.splitlines()[:16])
    return {key: value for key, _, value in pairs if key in UNIT_PROPERTIES}
