"""The tree's shell scripts pass shellcheck and can be run by Buildroot."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.unit.buildroot.tree import TREE


def scripts():
    return sorted(
        p for p in TREE.rglob("*") if p.is_file() and p.read_bytes()[:2] == b"#!"
    )  # fmt: skip


def test_the_board_scripts_are_found():
    names = {p.name for p in scripts()}
    assert {"post-build.sh", "post-image.sh"} <= names


@pytest.mark.parametrize("script", scripts(), ids=lambda p: str(p.relative_to(TREE)))
def test_script_is_executable(script):
    """Buildroot runs BR2_ROOTFS_POST_*_SCRIPT directly: without the x bit the build stops."""
    assert script.stat().st_mode & 0o111, f"{script}: chmod +x"


@pytest.mark.skipif(
    shutil.which("shellcheck") is None,
    reason="shellcheck is not installed (Debian package shellcheck, tests/debian-packages.txt)",
)
@pytest.mark.parametrize("script", scripts(), ids=lambda p: str(p.relative_to(TREE)))
def test_shellcheck_passes(script):
    done = subprocess.run(
        ["shellcheck", "--external-sources", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
