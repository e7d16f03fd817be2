"""`rackboot setup --answers FILE`: the dialog's questions answered from a file, with the
same validation; a wrong answer is a configuration error naming the file and key (exit 2)
and leaves the configuration as it was."""

from __future__ import annotations

import json
import tomllib

import pytest

from appliance.cli import main
from appliance.cluster.files import ClusterFiles
from appliance.errors import EXIT_CONFIG, EXIT_OK

from .conftest import FIRST_ANSWERS


def setup(capsys, machine, answers: str, name="answers.toml"):
    path = machine.root / name
    path.write_text(answers)
    code = main(["setup", "--config", str(machine.config), "--answers", str(path), "--no-start"])
    out, err = capsys.readouterr()
    return code, out, err


def test_answers_write_a_valid_configuration_and_create_the_cluster(capsys, machine):
    code, out, err = setup(capsys, machine, FIRST_ANSWERS)
    assert (code, err) == (EXIT_OK, "")
    doc = tomllib.loads(machine.config.read_text())
    assert doc["node"] == {"data_dir": str(machine.data), "shutdown_grace": 2.5,
                           "name": "rb-a", "rack": "r12"}  # fmt: skip
    assert doc["dhcp"]["lease_time"] == 600
    assert doc["ha"] == {"vip": "10.1.0.2/24", "vip_interface": "eth1"}
    assert "join token, valid once" in out and "rbj1." in out
    assert "Not starting the service (--no-start). To run it: rackboot run" in out
    assert ClusterFiles(str(machine.data)).is_ca()
    assert main(["config", "check", str(machine.config)]) == EXIT_OK


def test_json_answers_with_a_missing_key_keep_the_current_value(capsys, machine):
    assert setup(capsys, machine, FIRST_ANSWERS)[0] == EXIT_OK
    before = tomllib.loads(machine.config.read_text())
    machine.config.chmod(0o600)  # the operator's choice of mode survives the rewrite
    answers = {"rack": "r13", "cluster": "keep"}  # everything else: as it is
    code, _, err = setup(capsys, machine, json.dumps(answers), name="answers.json")
    assert (code, err) == (EXIT_OK, "")
    before["node"]["rack"] = "r13"
    assert tomllib.loads(machine.config.read_text()) == before
    assert machine.config.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("vip = \"10.1.0.2\"", "vip = \"10.1.0.150\""),
         ": vip: expected a virtual IP outside the pools of 10.1.0.0/24 (DHCP would lease it), "
         "found str '10.1.0.150'"),
        (("network = \"10.1.0.0/24\"", "network = \"10.1.0.0/33\""),
         ": subnets.eth1.network: expected a subnet in CIDR notation"),
        (("pools = [\"10.1.0.100-10.1.0.199\"]", "pools = [\"10.1.0.100-10.1.1.9\"]"),
         ": subnets.eth1.pools: expected a pool inside 10.1.0.0/24 (10.1.1.9 is not), "
         "found list ['10.1.0.100-10.1.1.9']"),
        (("interfaces = [\"eth1\"]", "interfaces = [\"eth7\"]"),
         ": interfaces: expected interfaces of this machine (eth0, eth1); there is no 'eth7'"),
        (("rack = \"r12\"\n", ""), ": rack: expected a rack name of letters"),
        (("rack = \"r12\"", "rack = 12"), ": rack: expected a string (or a list of strings), found int 12"),
        (("cluster = \"new\"", "cluster = \"join\""), ": token: expected a join token"),
        (("cluster = \"new\"", "cluster = \"new\"\ntoken = \"x\""), ": token: expected a key the setup asks for here"),
        (("router = ", "dns = [\"10.1.0.53\"]\nrouter = "), ": subnets.eth1.dns: expected a key the setup asks for here"),
    ],
)  # fmt: skip
def test_a_bad_answer_exits_2_naming_the_key_and_writes_nothing(capsys, machine, change, message):
    before = machine.config.read_bytes()
    code, _, err = setup(capsys, machine, FIRST_ANSWERS.replace(*change))
    assert code == EXIT_CONFIG
    assert err.startswith(f"rackboot: error: {machine.root / 'answers.toml'}{message}"), err
    assert len(err.splitlines()) == 1
    assert machine.config.read_bytes() == before
    assert not machine.data.exists()


def test_answers_refused_by_config_check_write_nothing(capsys, machine):
    """TFTP on DHCP's port: fine until the answers give DHCP an interface (`config check`)."""
    machine.config.write_text(machine.config.read_text() + "\n[tftp]\nport = 67\n")
    before = machine.config.read_bytes()
    code, _, err = setup(capsys, machine, FIRST_ANSWERS)
    assert code == EXIT_CONFIG
    assert "would not pass `config check`" in err and f"{machine.config}: " in err
    assert machine.config.read_bytes() == before


def test_a_join_that_cannot_reach_the_ca_holder_keeps_the_file_and_says_what_to_run(
    capsys, machine, tmp_path
):
    """The token is valid (another cluster's), but nobody listens at its address."""
    import time

    from appliance.cluster import authority

    holder = ClusterFiles(str(tmp_path / "holder"))
    authority.init_cluster(holder, "holder", time.time())
    token = authority.issue_token(holder, ["127.0.0.1:1"], 600, time.time()).encode()
    answers = FIRST_ANSWERS.replace('cluster = "new"', f'cluster = "join"\ntoken = "{token}"')
    code, out, _ = setup(capsys, machine, answers)
    assert code == 1
    assert "rackboot: error: cluster join failed: could not join the cluster: " in out
    assert f"run `rackboot cluster join TOKEN --config {machine.config}`" in out
    assert tomllib.loads(machine.config.read_text())["node"]["name"] == "rb-a"
    assert not ClusterFiles(str(machine.data)).enrolled()
