"""What setup reads and does on the machine: interfaces from a /sys/class/net-shaped
directory, the atomic write, and when it may use systemd."""

from __future__ import annotations

import os
import stat

import pytest

from appliance.setup import system
from appliance.setup.questions import Interface


def test_interfaces_are_listed_with_state_and_mac(machine):
    (machine.sys_net / "wlan0").mkdir()  # an interface without the attributes
    assert system.interfaces() == [
        Interface("eth0", "up", "52:54:00:12:34:56"),
        Interface("eth1", "down", "52:54:00:ab:cd:ef"),
        Interface("wlan0", "?", "-"),
    ]
    assert system.interfaces(str(machine.root / "missing")) == []


def test_the_real_sys_class_net_lists_loopback(monkeypatch):
    monkeypatch.delenv(system.SYS_NET_VARIABLE, raising=False)
    found = {i.name: i for i in system.interfaces()}
    assert found["lo"].mac == "00:00:00:00:00:00"


def test_write_replaces_the_file_whole_with_its_mode(tmp_path):
    path = tmp_path / "etc" / "rackboot.toml"
    system.write_atomically(path, "a = 1\n")
    assert path.read_text() == "a = 1\n" and stat.S_IMODE(path.stat().st_mode) == 0o644
    system.write_atomically(path, "b = 2\n", 0o600)
    assert path.read_text() == "b = 2\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == ["rackboot.toml"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_file(tmp_path):
    path = tmp_path / "rackboot.toml"
    path.write_text("old = true\n")
    with pytest.raises(UnicodeEncodeError):  # fails after the temporary file exists
        system.write_atomically(path, "new = true\n" + "\udc80" * 10)
    assert path.read_text() == "old = true\n"
    assert os.listdir(tmp_path) == ["rackboot.toml"]


def test_systemd_is_used_only_when_it_runs_and_knows_the_unit(tmp_path):
    running, units = tmp_path / "run-systemd", tmp_path / "units"
    units.mkdir()
    found = lambda name: f"/usr/bin/{name}"  # noqa: E731
    ask = lambda **kw: system.service_command(str(running), (str(units),), **kw)  # noqa: E731
    assert ask(which=found) is None  # no systemd running (a container, the build VM)
    running.mkdir()
    assert ask(which=found) is None  # systemd, but no rackboot unit
    (units / "rackboot.service").write_text("[Service]\n")
    assert ask(which=found) == ["systemctl"]
    assert ask(which=lambda name: None) is None  # no systemctl program
    running.rmdir()
    assert ask(which=found) is None  # the unit installed, but systemd not running
