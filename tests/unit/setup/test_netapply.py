"""Setup's network step (appliance/setup/netapply.py): where the files go (beside the
configuration when systemd-networkd reads that directory, as on the images; with
--network-dir; else shown only), each written atomically, setup's stale files removed
and nobody else's, the reload and the wait for the addresses."""

from __future__ import annotations

import os
import subprocess

from appliance.cli import main
from appliance.errors import EXIT_OK
from appliance.schema import validate_table
from appliance.setup import netapply
from appliance.setup.networkd import NETWORK, UNCONFIGURED

from .conftest import FIRST_ANSWERS

TABLE = {"management_interface": "eth0", "management_address": "10.0.0.5/24",
         "provisioning": [{"interface": "eth1", "address": "10.1.0.5/24"}]}  # fmt: skip


def test_the_directory_beside_the_configuration_is_used_when_networkd_reads_it(tmp_path):
    config = tmp_path / "data/etc/rackboot/rackboot.toml"
    config.parent.mkdir(parents=True)
    system_dir = tmp_path / "etc/systemd/network"
    system_dir.parent.mkdir(parents=True)
    assert netapply.managed_dir(config, system_dir) is None  # an ordinary machine
    system_dir.symlink_to(config.parent / "network")  # the images' link (dangling at first)
    assert netapply.managed_dir(config, system_dir) == config.parent / "network"
    other = tmp_path / "elsewhere/rackboot.toml"
    assert netapply.managed_dir(other, system_dir) is None


def test_files_are_replaced_and_only_setups_stale_ones_removed(tmp_path):
    directory = tmp_path / "network"
    directory.mkdir()
    (directory / "20-wired.network").write_text("[Match]\nName=eth9\n")  # the operator's own
    (directory / "10-rackboot-eth7.network").write_text("old\n")  # setup's, eth7 no longer
    (directory / "10-rackboot-eth1.network").write_text("old\n")
    removed = netapply.write_files(directory, {"10-rackboot-eth1.network": "new\n",
                                               UNCONFIGURED: "rest\n"})  # fmt: skip
    assert removed == ["10-rackboot-eth7.network"]
    assert sorted(os.listdir(directory)) == ["10-rackboot-eth1.network", "20-wired.network",
                                             UNCONFIGURED]  # fmt: skip
    assert (directory / "10-rackboot-eth1.network").read_text() == "new\n"
    assert (directory / "10-rackboot-eth1.network").stat().st_mode & 0o777 == 0o644


def test_setup_writes_them_with_network_dir(capsys, machine):
    answers = machine.root / "answers.toml"
    answers.write_text(FIRST_ANSWERS)
    target = machine.root / "networkd"
    argv = ["setup", "--config", str(machine.config), "--answers", str(answers), "--no-start",
            "--network-dir", str(target)]  # fmt: skip
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert sorted(os.listdir(target)) == ["10-rackboot-eth0.network", "10-rackboot-eth1.network",
                                          UNCONFIGURED]  # fmt: skip
    assert "Address=10.1.0.5/24\n" in (target / "10-rackboot-eth1.network").read_text()
    assert f"to {target}." in out and "not written" not in out


def test_without_a_directory_networkd_reads_setup_shows_the_files(capsys, machine):
    answers = machine.root / "answers.toml"
    answers.write_text(FIRST_ANSWERS)
    argv = ["setup", "--config", str(machine.config), "--answers", str(answers), "--no-start"]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert "The network: not written" in out and "--network-dir DIR" in out
    assert "--- 10-rackboot-eth1.network\n" in out and "Address=10.1.0.5/24\n" in out
    assert not (machine.config.parent / "network").exists()


class FakeSystem:
    """systemctl, networkctl and ip as setup calls them; eth1's address shows up late."""

    def __init__(self, networkd_active: bool = True, shows_after: int = 2) -> None:
        self.calls: list[list[str]] = []
        self.active, self.shows_after, self.looks = networkd_active, shows_after, 0

    def __call__(self, argv, **kw):
        self.calls.append(argv)
        if argv[:2] == ["systemctl", "is-active"]:
            return subprocess.CompletedProcess(argv, 0 if self.active else 3, "", "")
        if argv[0] == "ip":
            self.looks += 1
            shown = {"eth0": "2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\n",
                     "eth1": "3: eth1    inet 10.1.0.5/24 brd 10.1.0.255 scope global eth1\n"}  # fmt: skip
            late = argv[-1] == "eth1" and self.looks <= self.shows_after * 2
            return subprocess.CompletedProcess(argv, 0, "" if late else shown[argv[-1]], "")
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_reload_only_when_networkd_runs():
    running = FakeSystem()
    assert netapply.reload(running) is None
    assert ["networkctl", "reload"] in running.calls
    stopped = FakeSystem(networkd_active=False)
    assert "not running" in netapply.reload(stopped)
    assert ["networkctl", "reload"] not in stopped.calls


def test_addresses_are_waited_for_within_a_deadline():
    network = validate_table(NETWORK.fields, TABLE, "f", "network", dev=False)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    late = FakeSystem(shows_after=2)
    assert netapply.missing_addresses(network, late, 20.0, lambda: now[0], sleep) == []
    assert 0 < now[0] < 20.0
    never = FakeSystem(shows_after=10**6)
    now[0] = 0.0
    missing = netapply.missing_addresses(network, never, 5.0, lambda: now[0], sleep)
    assert missing == ["eth1 10.1.0.5/24"] and now[0] >= 5.0


def test_a_directory_that_cannot_be_written_fails_the_step(tmp_path):
    said: list[str] = []
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = netapply.step(tmp_path / "rackboot.toml", TABLE, blocker / "network", said.append)
    assert code == 1 and "the network files in" in said[0] and "run `rackboot setup" in said[1]
