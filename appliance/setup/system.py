"""What setup needs from the machine: its interfaces, an atomic file write, the service."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from appliance.durable import fsync_directory
from appliance.setup.checks import Interface

# Tests (and a rescue shell) point this at a directory shaped like /sys/class/net:
# one sub-directory per interface with `operstate` and `address` files.
SYS_NET_VARIABLE = "RACKBOOT_SETUP_SYS_NET"
MAX_INTERFACES = 1024
UNIT = "rackboot"
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system",
             "/lib/systemd/system")  # fmt: skip


def interfaces(root: str | None = None) -> list[Interface]:
    root = root or os.environ.get(SYS_NET_VARIABLE) or "/sys/class/net"
    try:
        names = sorted(os.listdir(root))[:MAX_INTERFACES]
    except OSError:
        return []
    return [
        Interface(
            name,
            _attribute(root, name, "operstate") or "?",
            _attribute(root, name, "address") or "-",
        )
        for name in names
    ]


def _attribute(root: str, name: str, attribute: str) -> str:
    try:
        with open(os.path.join(root, name, attribute), "rb") as fh:
            return fh.read(64).decode("ascii", "replace").strip()
    except OSError:  # an interface that went away, or an attribute it lacks
        return ""


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Temporary file in the same directory, fsync, rename, fsync the directory: a
    reader (or a power cut) sees the old file or the new one, never part of either."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(temporary, path)
    except BaseException:  # Ctrl-C included: the temporary file never stays behind
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_directory(path.parent)


def service_command(
    systemd_root: str = "/run/systemd/system",
    unit_dirs: tuple[str, ...] = UNIT_DIRS,
    which: Callable[[str], str | None] = shutil.which,
) -> list[str] | None:
    """``systemctl`` when systemd runs this machine and knows the unit, else None."""
    if not os.path.isdir(systemd_root) or which("systemctl") is None:
        return None
    if not any(os.path.exists(os.path.join(d, f"{UNIT}.service")) for d in unit_dirs):
        return None
    return ["systemctl"]


def start_service(systemctl: list[str], run=subprocess.run) -> tuple[bool, str]:
    """Start the unit, or restart it when it runs, so that it reads the new file."""
    active = run([*systemctl, "is-active", "--quiet", UNIT], check=False).returncode == 0
    action = "restart" if active else "start"
    done = run([*systemctl, action, UNIT], check=False, capture_output=True, text=True, timeout=120)
    message = (done.stderr or done.stdout or "").strip().splitlines()
    return done.returncode == 0, f"systemctl {action} {UNIT}" + (
        f": {message[-1]}" if done.returncode and message else ""
    )
