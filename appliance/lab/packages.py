"""The programs ``rackboot lab`` runs besides Rackboot, the Debian packages they come
from, and installing the missing ones with apt-get (as tests/run does for the tests),
unless told not to. The VM's kernel and busybox are not installed: appliance/lab/debs.py
fetches them as files."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from appliance.errors import LabUnavailable
from appliance.lab import vm

APT_TIMEOUT = 900.0  # an install from a slow mirror; normally seconds


@dataclass(frozen=True)
class Need:
    what: str  # a command on $PATH, or an absolute path
    package: str

    def present(self) -> bool:
        if self.what.startswith("/"):
            return Path(self.what).exists()
        return shutil.which(self.what) is not None


NEEDS = (
    Need("ip", "iproute2"),
    Need(vm.QEMU, "qemu-system-x86"),
    Need(str(vm.IPXE_ROM), "ipxe-qemu"),  # BIOS iPXE of the VM's virtio NIC
    Need("apt-get", "apt"),  # fetches the VM's kernel and busybox (debs.py)
    Need("dpkg-deb", "dpkg"),
)


def missing() -> list[Need]:
    return [need for need in NEEDS if not need.present()]


def ensure(install: bool, say: Callable[[str], None]) -> None:
    """Every program present, installing what is missing when ``install`` and apt-get
    can; :class:`LabUnavailable` naming the packages otherwise."""
    lacking = missing()
    if not lacking:
        return
    names = sorted({need.package for need in lacking})
    what = ", ".join(need.what for need in lacking)
    command = f"apt-get install --no-install-recommends {' '.join(names)}"
    if not install:
        raise LabUnavailable(f"missing {what}: install them ({command}), or leave out "
                             "--no-install and the lab installs them")  # fmt: skip
    if shutil.which("apt-get") is None:
        raise LabUnavailable(f"missing {what}, and no apt-get here to install Debian's "
                             f"{', '.join(names)}: install their equivalents")  # fmt: skip
    say(f"installing {', '.join(names)} with apt-get (--no-install to refuse)")
    argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *names]
    problem = _apt(argv)
    if problem:  # stale or absent package lists (a fresh container): read them, try again
        problem = _apt(["apt-get", "update", "-q"]) or _apt(argv)
    if problem or missing():
        raise LabUnavailable(f"{command} failed: {problem or 'still missing afterwards'}")


def _apt(argv: list[str]) -> str:
    """Run apt-get; '' when it succeeded, else what went wrong (its last lines)."""
    try:
        res = subprocess.run(
            argv, capture_output=True, text=True, timeout=APT_TIMEOUT,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{' '.join(argv)}: {exc}"
    if res.returncode == 0:
        return ""
    return f"exit {res.returncode}: {res.stderr.strip()[-1500:]}"
