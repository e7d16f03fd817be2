"""A machine for `rackboot setup`: interfaces in a directory shaped like /sys/class/net
(RACKBOOT_SETUP_SYS_NET, docs/setup.md) and a configuration whose data directory is the
test's own, so that `cluster init` writes there and nothing needs root."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from appliance.setup.system import SYS_NET_VARIABLE

SEED = """# an operator's file: setup keeps what it does not ask about
[node]
data_dir = "{data}"
shutdown_grace = 2.5

[dhcp]
lease_time = 600
"""


@dataclass
class Machine:
    root: Path
    config: Path
    sys_net: Path
    data: Path


@pytest.fixture
def machine(tmp_path, monkeypatch) -> Machine:
    sys_net = tmp_path / "sys-class-net"
    for name, state, mac in (
        ("eth0", "up", "52:54:00:12:34:56"),
        ("eth1", "down", "52:54:00:ab:cd:ef"),
    ):
        (sys_net / name).mkdir(parents=True)
        (sys_net / name / "operstate").write_text(state + "\n")
        (sys_net / name / "address").write_text(mac + "\n")
    monkeypatch.setenv(SYS_NET_VARIABLE, str(sys_net))
    monkeypatch.delenv("RACKBOOT_CONFIG", raising=False)
    config = tmp_path / "etc" / "rackboot.toml"
    config.parent.mkdir()
    config.write_text(SEED.format(data=tmp_path / "data"))
    return Machine(tmp_path, config, sys_net, tmp_path / "data")


# The answers of a first setup, as an answers file says them (docs/setup.md).
FIRST_ANSWERS = """name = "rb-a"
rack = "r12"
management_interface = "eth0"
management_address = "10.0.0.5/24"
management_gateway = "10.0.0.1"
interfaces = ["eth1"]
vip = "10.1.0.2"
cluster = "new"

[subnets.eth1]
network = "10.1.0.0/24"
address = "10.1.0.5"
pools = ["10.1.0.100-10.1.0.199"]
router = "10.1.0.1"
"""
