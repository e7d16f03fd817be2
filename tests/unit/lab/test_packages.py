"""rackboot lab installs the programs it lacks with apt-get, or says which and how
(appliance/lab/packages.py). A fake apt-get on $PATH stands in for Debian's."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from appliance.errors import EXIT_LAB_UNAVAILABLE, LabUnavailable
from appliance.lab import packages


@pytest.fixture
def needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One needed file, absent; $PATH with only tmp_path/bin (where a fake apt-get goes)."""
    rom = tmp_path / "efi-virtio.rom"
    monkeypatch.setattr(packages, "NEEDS", (packages.Need(str(rom), "ipxe-qemu"),))
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    return rom


def fake_apt(tmp_path: Path, body: str) -> Path:
    """apt-get as a shell script; every call appended to calls.log."""
    script = tmp_path / "bin" / "apt-get"
    script.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls.log\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return tmp_path / "calls.log"


def test_nothing_missing_nothing_done(needs: Path) -> None:
    needs.touch()
    packages.ensure(install=True, say=pytest.fail)


def test_without_install_the_error_names_the_package_and_the_command(needs: Path) -> None:
    with pytest.raises(LabUnavailable) as err:
        packages.ensure(install=False, say=pytest.fail)
    assert err.value.exit_code == EXIT_LAB_UNAVAILABLE
    assert f"missing {needs}" in str(err.value)
    assert "apt-get install --no-install-recommends ipxe-qemu" in str(err.value)


def test_without_apt_get_it_says_so(needs: Path) -> None:
    with pytest.raises(LabUnavailable, match="no apt-get here"):
        packages.ensure(install=True, say=pytest.fail)


def test_apt_get_installs_what_is_missing(needs: Path, tmp_path: Path) -> None:
    calls = fake_apt(tmp_path, f'[ "$1" = install ] && : > {needs}\nexit 0')
    said: list[str] = []
    packages.ensure(install=True, say=said.append)
    assert said == ["installing ipxe-qemu with apt-get (--no-install to refuse)"]
    assert calls.read_text().split("\n")[0] == "install -y -q --no-install-recommends ipxe-qemu"


def test_stale_package_lists_are_read_again_once(needs: Path, tmp_path: Path) -> None:
    # The first install fails (no lists yet); after an update the second one works.
    calls = fake_apt(
        tmp_path,
        f"""
case "$1" in
  update) : > {tmp_path}/updated ;;
  install) [ -e {tmp_path}/updated ] || {{ echo "E: Unable to locate package" >&2; exit 100; }}
           : > {needs} ;;
esac""",
    )
    packages.ensure(install=True, say=lambda _: None)
    assert [line.split()[0] for line in calls.read_text().splitlines()] == [
        "install", "update", "install"
    ]  # fmt: skip


def test_a_failed_install_says_what_apt_get_said(needs: Path, tmp_path: Path) -> None:
    fake_apt(tmp_path, 'echo "E: Unable to locate package ipxe-qemu" >&2; exit 100')
    with pytest.raises(LabUnavailable, match="exit 100: E: Unable to locate package ipxe-qemu"):
        packages.ensure(install=True, say=lambda _: None)
