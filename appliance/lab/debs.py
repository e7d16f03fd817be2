"""Debian packages the lab's VMs boot (``rackboot lab``, the netboot tests), used as
files: ``apt-get download`` + ``dpkg-deb -x`` into a cache directory, one unpacked tree
per package version, reused across runs.

They are not installed: ``busybox-static`` conflicts with ``busybox`` (the real
tests use it), and installing a kernel runs initramfs-tools for an initramfs
nobody uses and fills /boot. Unpacked, the kernel is ~106 MB of cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from appliance.lab.netns import LabError

# Debian's cloud kernel: 27 MB .deb (the generic one is ~70 MB); virtio-net and
# virtio-pci are modules in it (no e1000 at all), so the initrd carries them.
KERNEL_METAPACKAGE = "linux-image-cloud-amd64"
BUSYBOX_PACKAGE = "busybox-static"
APT_TIMEOUT = 600.0  # a download on a slow mirror; normally seconds


class DebError(LabError):
    """A package could not be fetched or unpacked; the text names the command and its output."""


@dataclass(frozen=True)
class Kernel:
    version: str  # "6.1.0-56-cloud-amd64"
    image: Path  # boot/vmlinuz-VERSION (a bzImage with an EFI stub)
    modules: Path  # lib/modules/VERSION
    config: Path  # boot/config-VERSION

    def built_in(self, option: str) -> bool:
        """``CONFIG_<option>=y`` in the kernel's configuration."""
        return f"CONFIG_{option}=y" in self.config.read_text().splitlines()


def kernel(cache: Path) -> Kernel:
    """The kernel the metapackage currently points to, unpacked under ``cache``."""
    package = _depends_on(KERNEL_METAPACKAGE, prefix="linux-image-")
    tree = unpack(package, cache)
    (image,) = sorted((tree / "boot").glob("vmlinuz-*"))
    version = image.name.removeprefix("vmlinuz-")
    return Kernel(
        version, image, tree / "lib" / "modules" / version, tree / "boot" / f"config-{version}"
    )


def busybox(cache: Path) -> Path:
    """The statically linked busybox binary, unpacked under ``cache``."""
    return unpack(BUSYBOX_PACKAGE, cache) / "bin" / "busybox"


def unpack(package: str, cache: Path) -> Path:
    """The candidate version of ``package`` unpacked under ``cache`` (fetched once per version).
    Older unpacked versions of the same package are removed."""
    cache.mkdir(parents=True, exist_ok=True)
    version = _field(package, "Version")
    target = cache / f"{package}_{version.replace(':', '_')}"
    with _locked(cache):
        if target.is_dir():
            return target
        with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
            deb = _download(package, Path(tmp))
            tree = Path(tmp) / "tree"
            _run(["dpkg-deb", "-x", str(deb), str(tree)])
            tree.rename(target)  # atomic: a tree in the cache is always complete
        for old in cache.glob(f"{package}_*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
    return target


def _download(package: str, into: Path) -> Path:
    # The sandbox user (_apt) cannot write a root-owned temporary directory.
    argv = ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", package]
    try:
        _run(argv, cwd=into)
    except DebError:
        # A fresh container has no package lists yet: read them once, try again.
        _run(["apt-get", "update", "-q"])
        _run(argv, cwd=into)
    (deb,) = into.glob(f"{package}_*.deb")
    return deb


def _depends_on(metapackage: str, *, prefix: str) -> str:
    """The package named ``prefix...`` that ``metapackage``'s candidate depends on."""
    depends = _field(metapackage, "Depends")
    for alternative in re.split(r"[,|]", depends):
        name = alternative.split()[0] if alternative.strip() else ""
        if name.startswith(prefix):
            return name
    raise DebError(f"{metapackage}: no dependency named {prefix}* in {depends!r}")


def _field(package: str, name: str) -> str:
    """A field of the candidate version's record (``apt-cache show --no-all-versions``)."""
    argv = ["apt-cache", "show", "--no-all-versions", package]
    try:
        out = _run(argv)
    except DebError:
        _run(["apt-get", "update", "-q"])
        out = _run(argv)
    for line in out.splitlines():
        if line.startswith(f"{name}: "):
            return line.split(": ", 1)[1].strip()
    raise DebError(f"{' '.join(argv)}: no {name} field")


def _run(argv: list[str], cwd: Path | None = None) -> str:
    try:
        res = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=APT_TIMEOUT,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )  # fmt: skip
    except FileNotFoundError:
        raise DebError(
            f"{argv[0]}: not found; the VM's kernel and busybox come from Debian's "
            "archive through apt (a Debian or Ubuntu host)"
        ) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DebError(f"{' '.join(argv)}: {exc}") from None
    if res.returncode != 0:
        raise DebError(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr.strip()[-2000:]}")
    return res.stdout


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One fetch per cache at a time (two labs or test runs may share it)."""
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
