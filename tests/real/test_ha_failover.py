"""Two appliances and a witness in network namespaces, real `rackboot run` and
`rackboot witness` processes, a real DHCP client (busybox udhcpc):

* kill -9 the active: the standby becomes active, the VIP moves (and the kernel
  drops it from the dead node), the client's retransmitted DISCOVER is answered
  by the new active;
* partition A from B with W seeing both: exactly one active, no flapping;
  isolate W: nothing changes;
* partition the active from B and W: B takes over, and the old active stopped
  before B started;
* SIGSTOP the active past its lease: on SIGCONT it sends nothing and steps down.

Partitions are blackhole routes inside the namespaces (the election is unicast
UDP; DHCP broadcasts still flow). Every wait is bounded; only our PIDs are signalled.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from appliance import control
from appliance.errors import RackbootError
from tests.support.dhcplab import DhcpNode, Udhcpc, rackboot, stop_process, wait_until
from tests.support.ha import enrol_members
from tests.support.netns import Lab, have_commands

PORT = 7471
pytestmark = pytest.mark.skipif(not have_commands("udhcpc"), reason="needs busybox udhcpc")


class HaNode(DhcpNode):
    """A rack appliance: DHCP on the lab link, the election, the VIP."""

    def _serving(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"node exited {self.proc.returncode}:\n{self.log_text()}")
        try:
            status = control.call(self.socket, "status", timeout=2.0)
        except RackbootError:
            return False
        return bool(status.get("dhcp", {}).get("serving")) and "election" in status["core"]["ha"]

    def ha(self) -> dict | None:
        try:
            return control.call(self.socket, "ha.status", timeout=2.0)
        except RackbootError:
            return None

    def active(self) -> bool:
        ha = self.ha()
        return bool(ha and ha["role"] == "active")


class Rack:
    def __init__(self, lab: Lab, tmp_path: Path) -> None:
        self.lab = lab
        self.hosts = {n: lab.add_host(n) for n in ("a", "b", "w")}
        self.client = lab.add_host("c", bare=True)
        self.vip = str(lab.network.network_address + 200)
        dirs = {n: tmp_path / n / "data" for n in ("a", "b")} | {"w": tmp_path / "w"}
        enrol_members(tmp_path, ["a", "b", "w"], dirs=dirs)
        self.nodes = {n: self._node(tmp_path, n) for n in ("a", "b")}
        self.witness_config = tmp_path / "w.toml"
        self.witness_config.write_text(
            f'[node]\nname = "w"\ndata_dir = "{dirs["w"]}"\n'
            f'[ha]\nlisten = "{self.hosts["w"].addr}"\nport = {PORT}\n'
        )
        self.witness_log = tmp_path / "w.log"
        self.witness: subprocess.Popen | None = None

    def address(self, name: str) -> str:
        return f"{self.hosts[name].addr}:{PORT}"

    def _node(self, tmp_path: Path, name: str) -> HaNode:
        host, other = self.hosts[name], "b" if name == "a" else "a"
        net = self.lab.network
        return HaNode(
            host,
            tmp_path / name,
            f"""
            [[dhcp.subnets]]
            network = "{net}"
            pools = ["{net.network_address + 100}-{net.network_address + 150}"]
            router = "{net.network_address + 1}"

            [cluster]
            listen = "{host.addr}"
            port = 7470
            mdns = false

            [ha]
            listen = "{host.addr}"
            port = {PORT}
            peers = ["{self.address(other)}"]
            witnesses = ["{self.address("w")}"]
            vip = "{self.vip}/{net.prefixlen}"
            vip_interface = "{host.ifname}"
            """,
            name=name,
        )

    def start(self) -> Rack:
        with self.witness_log.open("w") as out:
            self.witness = self.hosts["w"].popen(
                rackboot("witness", "--config", str(self.witness_config)),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        for node in self.nodes.values():
            node.start(timeout=60)
        wait_until(lambda: len(self.actives()) == 1, 20, "one active", detail=self.logs)
        return self

    def actives(self) -> list[str]:
        return [n for n, node in self.nodes.items() if node.active()]

    def has_vip(self, name: str) -> bool:
        host = self.hosts[name]
        out = host.run(["ip", "-4", "-o", "addr", "show", "dev", host.ifname]).stdout
        return f" {self.vip}/" in out

    def cut(self, a: str, b: str) -> None:
        """No unicast between ``a`` and ``b`` (both ways) from now on."""
        for x, y in ((a, b), (b, a)):
            self.hosts[x].run(["ip", "route", "add", "blackhole", f"{self.hosts[y].addr}/32"],
                              check=True)  # fmt: skip

    def logs(self) -> str:
        texts = [f"--- {n}\n{node.log_text()[-3000:]}" for n, node in self.nodes.items()]
        if self.witness_log.exists():
            texts.append(f"--- w\n{self.witness_log.read_text()[-2000:]}")
        return "\n".join(texts)

    def close(self) -> None:
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                stop_process(node.proc, signal.SIGTERM, 10)
        if self.witness is not None and self.witness.poll() is None:
            stop_process(self.witness, signal.SIGTERM, 10)


@pytest.fixture
def rack(lab: Lab, tmp_path: Path):
    made = Rack(lab, tmp_path)
    try:
        yield made.start()
    finally:
        made.close()


def other(name: str) -> str:
    return "b" if name == "a" else "a"


def test_kill_9_the_active_and_the_standby_answers_the_clients_retransmit(rack, tmp_path):
    old = rack.actives()[0]
    new = other(old)
    wait_until(lambda: rack.has_vip(old), 5, "the VIP on the active", detail=rack.logs)
    assert not rack.has_vip(new)
    rack.nodes[old].kill9()
    killed = time.monotonic()
    client = Udhcpc(rack.client, tmp_path / "client").start()  # retransmits every second
    wait_until(lambda: rack.nodes[new].active(), 5, "the standby to take over", detail=rack.logs)
    took_over = time.monotonic() - killed
    bound = client.wait("bound", timeout=15)
    assert bound["serverid"] == rack.hosts[new].addr
    assert bound["ip"].startswith(str(rack.lab.network.network_address)[:-1])
    wait_until(lambda: rack.has_vip(new), 3, "the VIP on the new active", detail=rack.logs)
    # the dead node's kernel drops the VIP when its lifetime runs out
    wait_until(lambda: not rack.has_vip(old), 5, "the VIP gone from the killed node")
    assert took_over < 2.5, f"takeover took {took_over:.2f} s"
    ha = rack.nodes[new].ha()
    assert ha["epoch"] >= 2 and ha["vip"]["held"]
    client.stop()


def test_partitions(rack):
    first = rack.actives()[0]
    epoch = rack.nodes[first].ha()["epoch"]
    # A and B cannot talk, W sees both: the holder keeps the lease, nobody flaps
    rack.cut("a", "b")
    for _ in range(15):
        time.sleep(0.2)
        assert rack.actives() == [first]
    assert rack.nodes[first].ha()["epoch"] == epoch
    for name in ("a", "b"):
        rack.hosts[name].run(["ip", "route", "flush", "type", "blackhole"], check=True)
    # W isolated: nothing changes
    rack.cut("w", "a")
    rack.cut("w", "b")
    for _ in range(15):
        time.sleep(0.2)
        assert rack.actives() == [first]
    assert rack.nodes[first].ha()["epoch"] == epoch
    for name in ("a", "b", "w"):
        rack.hosts[name].run(["ip", "route", "flush", "type", "blackhole"], check=True)
    time.sleep(1.5)  # W votes again
    # the active cut from B and W: B takes over; the old active had stopped first
    second = other(first)
    rack.cut(first, second)
    rack.cut(first, "w")
    wait_until(lambda: rack.nodes[second].active(), 5, "the other side to take over",
               detail=rack.logs)  # fmt: skip
    wait_until(lambda: not rack.nodes[first].active(), 2, "the cut-off side to stop")
    lost = rack.nodes[first].ha()["changed_at"]["lost"]
    acquired = rack.nodes[second].ha()["changed_at"]["acquired"]
    assert lost < acquired, f"old active stopped at {lost}, new one started at {acquired}"
    assert not rack.has_vip(first)


def test_sigstop_past_the_lease_emits_nothing_and_steps_down(rack, tmp_path):
    old = rack.actives()[0]
    node = rack.nodes[old]
    before = node.status()["dhcp"]["messages"]
    node.proc.send_signal(signal.SIGSTOP)
    try:
        client = Udhcpc(rack.client, tmp_path / "client").start()
        # DISCOVERs queue up in the frozen node's socket while the other takes over
        bound = client.wait("bound", timeout=15)
        assert bound["serverid"] == rack.hosts[other(old)].addr
        time.sleep(1.0)
    finally:
        node.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: (node.ha() or {}).get("role") == "standby", 5, "the thawed node's step-down")
    after = node.status()["dhcp"]["messages"]
    # it read the DISCOVERs that waited in its socket, and answered none of them
    assert after["received"] > before["received"], json.dumps(after)
    assert after["sent"] == before["sent"], json.dumps(after)
    assert rack.actives() == [other(old)]
    client.stop()
