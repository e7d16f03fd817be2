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
import time
from pathlib import Path

import pytest

from tests.support.dhcplab import Udhcpc, wait_until
from tests.support.ha_lab import Rack
from tests.support.netns import Lab, have_commands

pytestmark = pytest.mark.skipif(not have_commands("udhcpc"), reason="needs busybox udhcpc")


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


def test_sigusr2_steps_down_and_sigusr1_takes_the_lease_back(rack):
    first = rack.actives()[0]
    second = other(first)
    rack.nodes[first].proc.send_signal(signal.SIGUSR2)
    wait_until(lambda: rack.actives() == [second], 3, "SIGUSR2: the other takes over",
               detail=rack.logs)  # fmt: skip
    rack.nodes[first].proc.send_signal(signal.SIGUSR1)
    wait_until(lambda: rack.actives() == [first], 3, "SIGUSR1: the hand-over back",
               detail=rack.logs)  # fmt: skip
    assert rack.nodes[second].ha()["last_change"].endswith("handover")
    wait_until(lambda: rack.has_vip(first) and not rack.has_vip(second), 3, "the VIP back")
