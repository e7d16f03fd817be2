"""Two appliances and a witness in network namespaces, real `rackboot run` and
`rackboot witness` processes, a real DHCP client (busybox udhcpc):

* kill -9 the active: the standby becomes active, the VIP moves (and the kernel
  drops it from the dead node), the client's retransmitted DISCOVER is answered
  by the new active;
* partition A from B with W seeing both: exactly one active, no flapping;
  isolate W: nothing changes;
* partition the active from B and W: B takes over, and the old active stopped
  before B started;
* SIGSTOP the active past its lease: on SIGCONT it sends nothing and steps down;
* ARP for the VIP, asked every 5 ms across a kill -9 and a SIGSTOP of the active:
  the old holder's last answer comes before the new holder's first (the VIP guard).

Partitions are blackhole routes inside the namespaces (the election is unicast
UDP; DHCP broadcasts still flow). Every wait is bounded; only our PIDs are signalled.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.support import arp_probe
from tests.support.dhcplab import Udhcpc, wait_until
from tests.support.netns import have_commands

pytestmark = pytest.mark.skipif(not have_commands("udhcpc"), reason="needs busybox udhcpc")


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
    assert bound["serverid"] == rack.vip  # the VIP identifies the server, whoever holds it
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
        assert bound["serverid"] == rack.vip
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


def vip_answers(rack, seconds: float, act) -> list[tuple[float, str]]:
    """ARP for the VIP every 5 ms for ``seconds``, calling ``act()`` after half a second:
    every answer as (monotonic time, node name)."""
    client = rack.client
    probe = client.popen(
        [sys.executable, "-I", arp_probe.__file__, client.ifname, client.addr, rack.vip,
         str(seconds), "0.005"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.5)
    act()
    out, _ = probe.communicate(timeout=seconds + 10)
    names = {rack.hosts[n].mac: n for n in ("a", "b")}
    answers = [(float(t), names.get(mac, mac)) for t, mac in (line.split() for line in out.splitlines())]
    assert answers, "nobody answered ARP for the VIP"
    return answers


def assert_no_overlap(answers, old: str, new: str, since: float) -> float:
    """The old holder's answers all come before the new one's first; the silent gap in s."""
    assert {who for _, who in answers} <= {old, new}, answers[:5]
    first_new = min(t for t, who in answers if who == new)
    last_old = max((t for t, who in answers if who == old), default=since)
    assert last_old < first_new, (
        f"{old} answered ARP for the VIP {last_old - first_new:.3f} s after {new} first did"
    )
    return first_new - last_old


@pytest.mark.parametrize("how", ["kill-9", "sigstop"])
def test_arp_answers_for_the_vip_never_come_from_two_machines(probed_rack, how):
    rack = probed_rack
    old = rack.actives()[0]
    new = other(old)
    wait_until(lambda: rack.has_vip(old), 5, "the VIP on the active", detail=rack.logs)
    proc = rack.nodes[old].proc
    acted = []

    def act():
        acted.append(time.monotonic())
        if how == "kill-9":
            rack.nodes[old].kill9()
        else:
            proc.send_signal(signal.SIGSTOP)

    try:
        answers = vip_answers(rack, 3.5, act)
    finally:
        if how == "sigstop":
            proc.send_signal(signal.SIGCONT)
    gap = assert_no_overlap(answers, old, new, acted[0])
    print(f"{how}: ARP silent for {gap * 1000:.0f} ms between the two holders")
    assert any(who == old for t, who in answers if t < acted[0])
    assert any(who == new for _, who in answers), "the new holder never answered ARP"
    assert gap < 2.0
