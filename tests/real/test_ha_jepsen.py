"""Jepsen-style: a rack under churning DHCP clients while its active is killed, paused and
cut off, again and again; a client-side checker then verifies the two promises of
replicated state (tests/support/dhcp_checker.py):

* no address was ever bound to two machines with overlapping validity;
* every lease a client was acknowledged, and still valid at the end, is on the final
  active (bound to that MAC, expiring no earlier than the client believes).

Two appliances and a witness in namespaces (tests/support/ha_lab.py), 60 s leases
(renewals every 30 s, unicast to the server identifier: the VIP), 40 churning clients
(tests/support/dhcp_churn.py: bind, renew, rebind, leave, arrive). Faults: ``kill -9``
of the active (restarted, then given time to catch up before the next), SIGSTOP past
its lease, and a partition of the active from the others.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import dhcp_churn
from tests.support.dhcp_checker import double_bindings, lost_leases, parse
from tests.support.dhcplab import wait_until
from tests.support.ha_lab import Rack
from tests.support.netns import Lab, have_commands

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not have_commands("ip"), reason="needs iproute2")]  # fmt: skip

KILLS = 20
CLIENTS = 40  # the rack's pool holds 51 addresses


def other(name: str) -> str:
    return "b" if name == "a" else "a"


def caught_up(rack, name: str) -> bool:
    """The standby ``name`` follows the active and lacks nothing."""
    status = (rack.nodes[other(name)].status().get("core") or {}).get("state") or {}
    followers = (status.get("replication") or {}).get("followers") or {}
    return any(f.get("lag") == 0 and f.get("counted") for f in followers.values())


def settle(rack) -> str:
    wait_until(lambda: len(rack.actives()) == 1, 15, "one active", detail=rack.logs)
    return rack.actives()[0]


def restart(rack, name: str) -> None:
    rack.nodes[name].start(timeout=60)
    wait_until(lambda: caught_up(rack, name), 20, f"{name} to catch up", detail=rack.logs)


@pytest.fixture
def rack(lab: Lab, tmp_path: Path):
    """A rack handing out 60 s leases, so clients renew and churn within the test."""
    made = Rack(lab, tmp_path, client_addr=True, dhcp="lease_time = 60\n")
    try:
        yield made.start()
    finally:
        made.close()


def test_no_double_binding_and_no_acknowledged_lease_lost_across_faults(rack, tmp_path: Path):
    churn = rack.client.popen(
        [sys.executable, "-m", "tests.support.dhcp_churn", rack.client.ifname, str(CLIENTS),
         "3600", "--leave", "0.3"],
        stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
        cwd=Path(dhcp_churn.__file__).parents[2],
    )  # fmt: skip
    try:
        time.sleep(5)  # the population binds
        for n in range(KILLS):
            active = settle(rack)
            rack.nodes[active].kill9()
            settle(rack)
            restart(rack, active)
            time.sleep(0.5 + (n % 4) * 0.7)  # kills at varied moments of the clients' cycles
        active = settle(rack)  # paused past its lease: the other takes over meanwhile
        rack.nodes[active].proc.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: rack.nodes[other(active)].active(), 10, "takeover from a pause")
            time.sleep(1.0)
        finally:
            rack.nodes[active].proc.send_signal(signal.SIGCONT)
        wait_until(lambda: caught_up(rack, active), 20, "the paused node to catch up")
        active = settle(rack)  # cut off from the standby and the witness
        rack.cut(active, other(active))
        rack.cut(active, "w")
        wait_until(lambda: rack.nodes[other(active)].active(), 10, "takeover across a cut")
        time.sleep(2.0)
        for name in ("a", "b", "w"):
            rack.hosts[name].run(["ip", "route", "flush", "type", "blackhole"], check=True)
        wait_until(lambda: caught_up(rack, active), 20, "the cut-off node to catch up")
        time.sleep(3)
    finally:
        out, _ = churn.communicate(input="", timeout=30)
    final = rack.nodes[settle(rack)]
    at = time.time()
    leases = {x["address"]: (x["mac"], x["expires"]) for x in final.leases()
              if x["state"] == "bound"}  # fmt: skip
    answers = parse(out.splitlines())
    acks = [a for a in answers if type(a).__name__ == "Ack"]
    print(f"{len(acks)} ACKs, {len(answers) - len(acks)} NAKs to {CLIENTS}+ clients across "
          f"{KILLS} kills, a pause and a partition; {len(leases)} leases on the final active")
    assert len(acks) > CLIENTS * 2, "the clients were not served enough to prove anything"
    assert double_bindings(answers) == []
    assert lost_leases(answers, leases, at) == []
