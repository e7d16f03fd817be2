"""A lab's record while it runs, and what is left when one did not tear down.

``/run/rackboot-lab/<id>.lock`` is created already locked (written under a temporary
name, locked, renamed) and stays locked by the lab for its whole life; the kernel drops
the lock when the lab's process dies, however it dies. appliance/lab/census.py judges
what is found; here are the looks and the removal: the processes inside a stale lab's
namespaces, found by their network namespace (``/proc/PID/ns/net``, as ``ip netns
pids`` does) and ended by PID, then the namespaces, then the record.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.lab import census
from appliance.lab.netns import LabError, delete_netns

REGISTRY = Path("/run/rackboot-lab")
TERM_WAIT = 5.0  # seconds a process gets after SIGTERM, then as long after SIGKILL
OWN_WORKDIR = "rackboot-lab-"  # the prefix of a work directory the lab made itself


@dataclass
class Claim:
    """This lab's locked record; :meth:`release` when everything is torn down."""

    lab_id: str
    path: Path
    fd: int

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self.fd)


def claim(lab_id: str, info: dict[str, Any], registry: Path = REGISTRY) -> Claim:
    """Write and lock this lab's record before anything of it exists."""
    registry.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = registry / f".{lab_id}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({**info, "pid": os.getpid()}).encode())
        os.rename(temporary, registry / f"{lab_id}.lock")  # seen only once locked
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    return Claim(lab_id, registry / f"{lab_id}.lock", fd)


def records(registry: Path = REGISTRY) -> dict[str, bool]:
    """Every lab record, by id: True while its lab holds the lock (it runs)."""
    found: dict[str, bool] = {}
    for path in registry.glob("*.lock") if registry.is_dir() else ():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            found[path.stem] = False
        except BlockingIOError:
            found[path.stem] = True
        finally:
            os.close(fd)
    return found


def namespaces() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def survey(registry: Path = REGISTRY) -> census.Verdict:
    return census.judge(namespaces(), records(registry))


def clean_stale(verdict: census.Verdict, say: Callable[[str], None],
                registry: Path = REGISTRY) -> None:  # fmt: skip
    """Remove every stale lab of ``verdict``: its processes, namespaces, record. A record
    another process locked meanwhile (a second lab cleaning it) is left to that one."""
    for lab_id, names in verdict.stale.items():
        path = registry / f"{lab_id}.lock"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            info = _read(path)
            ended = sum(len(end_processes_in(ns)) for ns in names)
            for ns in names:
                delete_netns(ns)
            workdir = str(info.get("workdir", ""))
            if info.get("remove_workdir") and Path(workdir).name.startswith(OWN_WORKDIR):
                shutil.rmtree(workdir, ignore_errors=True)
            path.unlink()
        finally:
            os.close(fd)
        say(f"removed the stale lab {lab_id} (its pid {info.get('pid', '?')} is gone): "
            f"{len(names)} namespaces, {ended} processes")  # fmt: skip


def pids_in(ns: str) -> list[int]:
    """The processes whose network namespace is ``ns`` (``ip netns pids``, in Python)."""
    try:
        inode = os.stat(f"/run/netns/{ns}").st_ino
    except FileNotFoundError:
        return []
    return [pid for pid in _all_pids() if _in(pid, inode)]


def end_processes_in(ns: str) -> list[int]:
    """End every process in ``ns`` (SIGTERM, then SIGKILL), each by PID, checked to be
    in ``ns`` again right before each signal. Returns the PIDs ended."""
    ended: list[int] = []
    try:
        inode = os.stat(f"/run/netns/{ns}").st_ino
    except FileNotFoundError:
        return ended
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in _all_pids() if _in(pid, inode)]
        for pid in alive:
            if _in(pid, inode):  # still that process, not a reused PID
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        ended += [pid for pid in alive if pid not in ended]
        deadline = time.monotonic() + TERM_WAIT
        while any(_in(pid, inode) for pid in alive) and time.monotonic() < deadline:
            time.sleep(0.05)
    left = [pid for pid in _all_pids() if _in(pid, inode)]
    if left:
        raise LabError(f"processes {left} in network namespace {ns} survived SIGKILL")
    return ended


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _in(pid: int, inode: int) -> bool:
    """Whether ``pid`` runs (not a zombie waiting for its parent) in namespace ``inode``."""
    try:
        if os.readlink(f"/proc/{pid}/ns/net") != f"net:[{inode}]":
            return False
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _read(path: Path) -> dict[str, Any]:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}
