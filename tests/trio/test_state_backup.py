"""`rackboot state backup|restore` (appliance/state/backup.py): a backup from a running
node restores into another, which serves its leases and writes again; a log written
under an election's epoch can be written to by a standalone node; a damaged file, a
running node and a file that is no backup are refused; the previous log is kept aside.
The commands run as the operator runs them (`python -m appliance`), the nodes in-process
(appliance.testing) on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from appliance.errors import EXIT_ALREADY_RUNNING, EXIT_FAILURE, EXIT_OK
from appliance.ha.service import read_durable
from appliance.state.backup import restore, write_backup
from appliance.state.records import Record
from appliance.state.tables import Tables
from tests.support.ha import enrol_members
from tests.trio.test_cluster import wait_until
from tests.trio.test_ha import actives, rack

MACS = [f"52:54:00:00:00:{n:02x}" for n in range(1, 4)]


def rackboot(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "appliance", *args, "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def config_for(data: Path) -> Path:
    """A configuration file naming only the data directory (what the CLI needs)."""
    path = data.parent / f"{data.name}.toml"
    path.write_text(f'[node]\ndata_dir = "{data}"\n')
    return path


def leases(node) -> dict[str, str]:
    return {lease["mac"]: lease["address"] for lease in node.control("dhcp.leases")}


def test_a_backup_of_a_running_node_restores_into_another(rackboot_node, tmp_path):
    first = rackboot_node(plugins=["dhcp"], data=tmp_path / "a")
    granted = {mac: str(first.dhcp.dora(mac).yiaddr) for mac in MACS}
    backup = tmp_path / "state.backup"
    done = rackboot("state", "backup", str(backup), "--json", config=config_for(tmp_path / "a"))
    assert done.returncode == EXIT_OK, done.stderr
    made = json.loads(done.stdout)
    assert made["from"] == "the running node" and made["namespaces"]["dhcp.leases"] == 3
    assert backup.stat().st_mode & 0o777 == 0o600
    first.stop()

    target = config_for(tmp_path / "b")
    restored = rackboot("state", "restore", str(backup), config=target)
    assert restored.returncode == EXIT_OK, restored.stderr
    assert "restored epoch 0 lsn" in restored.stdout and "dhcp.leases 3" in restored.stdout
    second = rackboot_node(plugins=["dhcp"], data=tmp_path / "b")
    assert leases(second) == granted
    assert str(second.dhcp.dora(MACS[0]).yiaddr) == granted[MACS[0]]  # renewed: it writes


def test_a_standalone_node_writes_over_a_log_of_an_elections_epoch(rackboot_node, tmp_path):
    """A rack's backup carries its lease's epoch: the node restoring it alone writes on
    (the store refuses a writer whose epoch is older than its log's)."""
    tables = Tables()
    tables.apply(Record(7, 1, "misc.notes", "k", "from epoch 7"))
    write_backup(tables, tmp_path / "rack.backup")
    restored = rackboot("state", "restore", str(tmp_path / "rack.backup"),
                        config=config_for(tmp_path / "c"))  # fmt: skip
    assert restored.returncode == EXIT_OK, restored.stderr
    # The election's remembered epoch is raised too: its next holder writes above 7.
    assert read_durable(tmp_path / "c" / "ha").epoch == 7
    node = rackboot_node(plugins=["dhcp"], data=tmp_path / "c")
    node.dhcp.dora(MACS[0])  # an ACK only once its lease's record committed
    assert node.status()["core"]["state"]["epoch"] == 7 and list(leases(node)) == [MACS[0]]


async def test_a_rack_restored_from_one_backup_elects_above_its_epoch(tmp_path):
    """Both appliances restored from a backup of epoch 7, the witness new (it remembers
    nothing): the election's next epoch is above 7, so the active writes; the standby
    follows from the same history."""
    tables = Tables()
    tables.apply(Record(7, 1, "misc.notes", "k", "from epoch 7"))
    write_backup(tables, tmp_path / "rack.backup")
    dirs = enrol_members(tmp_path, ["a", "b", "w"])
    for name in ("a", "b"):
        restore(dirs[name], tmp_path / "rack.backup", 0.0)
    async with rack(tmp_path) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        active = nodes[actives(nodes)[0]]
        standby = next(node for node in nodes.values() if node is not active)
        with trio.fail_after(5):
            position = await active.state.put("misc.notes", "after", "the restore")
        assert position.epoch > 7 and position.lsn == 2
        await wait_until(lambda: standby.state.position == position, what="the standby")
        assert standby.state.get("misc.notes", "k") == "from epoch 7"


def test_no_node_answering_the_log_on_disk_is_backed_up(rackboot_node, tmp_path):
    node = rackboot_node(plugins=["dhcp"], data=tmp_path / "d")
    node.dhcp.dora(MACS[0])
    node.stop()
    done = rackboot(
        "state", "backup", str(tmp_path / "off.backup"), config=config_for(tmp_path / "d")
    )
    assert done.returncode == EXIT_OK, done.stderr
    assert "from the log on disk (no node answers)" in done.stdout
    assert "dhcp.leases 1" in done.stdout


def test_what_cannot_be_restored_is_refused_and_nothing_changes(rackboot_node, tmp_path):
    node = rackboot_node(plugins=["dhcp"], data=tmp_path / "e")
    node.dhcp.dora(MACS[0])
    config = config_for(tmp_path / "e")
    good = tmp_path / "good.backup"
    assert rackboot("state", "backup", str(good), config=config).returncode == EXIT_OK
    # A running node keeps its state.
    busy = rackboot("state", "restore", str(good), config=config)
    assert busy.returncode == EXIT_ALREADY_RUNNING and "stop it before restoring" in busy.stderr
    node.stop()
    log = tmp_path / "e" / "state" / "log"
    before = log.read_bytes()
    data = good.read_bytes()
    for name, content in (("cut", data[:-3]), ("flipped", data[:20] + bytes([data[20] ^ 1]) + data[21:]),
                          ("text", b"not a backup\n"), ("empty", b"")):  # fmt: skip
        (tmp_path / name).write_bytes(content)
        refused = rackboot("state", "restore", str(tmp_path / name), config=config)
        assert refused.returncode == EXIT_FAILURE, (name, refused.stderr)
        assert str(tmp_path / name) in refused.stderr and "Traceback" not in refused.stderr
        assert log.read_bytes() == before, name
    missing = rackboot("state", "restore", str(tmp_path / "nowhere"), config=config)
    assert missing.returncode == EXIT_FAILURE and "cannot read" in missing.stderr


def test_the_previous_log_is_kept_aside(rackboot_node, tmp_path):
    node = rackboot_node(plugins=["dhcp"], data=tmp_path / "f")
    node.dhcp.dora(MACS[0])
    node.stop()
    config = config_for(tmp_path / "f")
    old = (tmp_path / "f" / "state" / "log").read_bytes()
    empty = Tables()
    write_backup(empty, tmp_path / "empty.backup")
    restored = rackboot("state", "restore", str(tmp_path / "empty.backup"), config=config)
    assert restored.returncode == EXIT_OK, restored.stderr
    (aside,) = (tmp_path / "f" / "state").glob("log.before-restore-*")
    assert aside.read_bytes() == old and f"kept at {aside}" in restored.stdout
    node = rackboot_node(plugins=["dhcp"], data=tmp_path / "f")
    assert leases(node) == {}


@pytest.mark.parametrize("args", [["state"], ["state", "restore"], ["state", "backup"]])
def test_usage_errors_are_one_line(args, tmp_path):
    wrong = subprocess.run([sys.executable, "-m", "appliance", *args],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1
