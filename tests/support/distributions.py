"""Installing a plugin's distribution offline, as a user would, into a throw-away directory.

``pip install --no-deps --no-build-isolation --no-index --target DIR SRC`` builds the
project with the setuptools already installed. setuptools older than 70.1 needs the
separate ``wheel`` package for ``bdist_wheel`` (Python 3.11's venv ships setuptools 65
without it). Where it is missing, the wheel is built here from what setuptools does
produce without it (``egg_info`` for the metadata and entry points, ``build_py`` for the
files) and installed with the same pip command. Put DIR on ``PYTHONPATH`` and the core
finds the plugin through its entry point.
"""

from __future__ import annotations

import base64
import email.parser
import hashlib
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT = 120.0  # one setuptools or pip run


def _run_here(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("cwd", REPO)
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False, **kwargs
    )


def _setuptools_builds_wheels() -> bool:
    """``bdist_wheel`` is in setuptools from 70.1 on; before, it comes with ``wheel``."""
    if importlib.util.find_spec("wheel") is not None:
        return True
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return (major, minor) >= (70, 1)


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _build_wheel_without_wheel_package(src: Path, work: Path) -> Path:
    """A pure-Python wheel (PEP 427) of the setuptools project ``src``, without ``wheel``."""
    meta, lib = work / "meta", work / "lib"
    meta.mkdir()
    lib.mkdir()
    setup = [sys.executable, "-c", "from setuptools import setup; setup()", "-q"]
    built = _run_here(
        [*setup, "egg_info", "--egg-base", str(meta), "build_py", "--build-lib", str(lib)],
        cwd=src,
    )
    assert built.returncode == 0, f"setuptools failed on {src}:\n{built.stdout}{built.stderr}"
    (egg_info,) = meta.glob("*.egg-info")
    pkg_info = (egg_info / "PKG-INFO").read_bytes()
    metadata = email.parser.BytesParser().parsebytes(pkg_info)
    stem = f"{re.sub(r'[-_.]+', '_', metadata['Name'])}-{metadata['Version']}"
    dist_info = f"{stem}.dist-info"

    files = {
        path.relative_to(lib).as_posix(): path.read_bytes()
        for path in sorted(lib.rglob("*"))
        if path.is_file()
    }
    files[f"{dist_info}/METADATA"] = pkg_info
    for name in ("entry_points.txt", "top_level.txt"):
        if (egg_info / name).is_file():
            files[f"{dist_info}/{name}"] = (egg_info / name).read_bytes()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests/support/distributions.py\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()]
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()

    wheel = work / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def pip_install(src: Path, target: Path, work: Path) -> None:
    """Install the project ``src`` into ``target`` with pip, offline and without dependencies."""
    work.mkdir(parents=True)
    # Build from a copy: an in-tree build leaves build/ and *.egg-info behind.
    copy = work / "src"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    what = copy if _setuptools_builds_wheels() else _build_wheel_without_wheel_package(copy, work)
    installed = _run_here(
        [
            *(sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"),
            *("--no-deps", "--no-build-isolation", "--no-index", "--target", str(target)),
            str(what),
        ]
    )
    assert installed.returncode == 0, (
        f"pip install {what} failed:\n{installed.stdout}{installed.stderr}"
    )
