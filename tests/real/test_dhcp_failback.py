"""Fail-back in a real rack (two ``rackboot run`` appliances and a witness in namespaces,
the VIP on the link: tests/support/ha_lab.py) with real busybox udhcpc clients:

* three clients bind through the active A (the VIP as server identifier);
* ``kill -9`` of A: B takes the lease and the VIP; every client renews by unicast to the
  VIP and B ACKs the same address (it had each lease before the client heard of it);
* a fourth client binds through B;
* A restarts, follows B and catches up (its state log's LSN is B's, and B counts it
  again); ``rackboot ha promote`` on A hands the lease back;
* every client renews with A, at the VIP, and keeps its address (no NAK, never an
  address of another), and the fourth client's lease, which only B wrote, is on A.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.support.dhcplab import Udhcpc, wait_until
from tests.support.ha_lab import Rack
from tests.support.netns import Lab, have_commands

pytestmark = pytest.mark.skipif(
    not have_commands("ip", "udhcpc"), reason="needs iproute2 and busybox udhcpc"
)

CLIENTS = 3


@pytest.fixture
def rack(lab: Lab, tmp_path: Path):
    """Short leases (60 s: the least the schema takes)."""
    made = Rack(lab, tmp_path, dhcp="lease_time = 60\n")
    try:
        yield made.start()
    finally:
        made.close()


def on(node, address: str) -> dict | None:
    """The lease of ``address`` in ``node``'s table, without the seconds it has left (a
    reading of the clock, not of the table)."""
    lease = next((x for x in node.leases() if x["address"] == address), None)
    return None if lease is None else {k: v for k, v in lease.items() if k != "remaining"}


def state_of(node) -> dict:
    return node.status()["core"]["state"]


def caught_up(rack: Rack, leader: str, follower: str) -> bool:
    """``follower``'s state log is at ``leader``'s position and ``leader`` counts it (it
    follows with everything, and the acceptors no longer hold it ineligible)."""
    try:
        ours, theirs = state_of(rack.nodes[leader]), state_of(rack.nodes[follower])
    except Exception:  # a node still starting answers nothing yet
        return False
    rows = ours.get("replication", {}).get("followers", {}).values()
    return bool(
        (ours["epoch"], ours["lsn"]) == (theirs["epoch"], theirs["lsn"])
        and rows and all(r["counted"] and r["lag"] == 0 for r in rows)
        and rack.nodes[leader].ha()["election"]["ineligible"] == []
    )  # fmt: skip


def detail(rack: Rack):
    """The appliances' logs and what their elections say, for a failure's message."""

    def text() -> str:
        states = {n: node.ha() for n, node in rack.nodes.items()}
        return rack.logs() + "\n--- ha status\n" + json.dumps(states, indent=1, default=str)

    return text


def renew(client: Udhcpc, address: str, vip: str) -> None:
    """A renewal by unicast to the VIP, ACKed with the same address."""
    renewed = client.nudge(signal.SIGUSR1, "renew", timeout=15)
    assert renewed["ip"] == address and renewed["serverid"] == vip


def test_fail_back_after_a_kill_9_keeps_every_lease_both_ways(
    rack: Rack, lab: Lab, tmp_path: Path
) -> None:
    (a,) = rack.actives()
    b = "b" if a == "a" else "a"
    clients = [
        Udhcpc(lab.add_host(f"k{n}", bare=True), tmp_path / f"udhcpc{n}")
        for n in range(CLIENTS + 1)
    ]
    old, new = clients[:CLIENTS], clients[CLIENTS]
    try:
        for client in old:
            client.start()
        addresses = []
        for client in old:
            bound = client.wait("bound", 20)
            assert bound["serverid"] == rack.vip
            addresses.append(bound["ip"])
            lease = on(rack.nodes[b], bound["ip"])  # acknowledged: committed on the standby
            assert lease is not None and lease["mac"] == client.host.mac
        assert len(set(addresses)) == CLIENTS

        rack.nodes[a].kill9()
        wait_until(lambda: rack.actives() == [b], 15, "B takes over", detail=rack.logs)
        wait_until(lambda: rack.has_vip(b), 5, "the VIP on B")
        epoch_b = rack.nodes[b].ha()["epoch"]
        for client, address in zip(old, addresses, strict=True):
            renew(client, address, rack.vip)

        new.start()  # started late: it binds through B
        bound = new.wait("bound", 20)
        fresh = bound["ip"]
        assert bound["serverid"] == rack.vip and fresh not in addresses
        written_by_b = on(rack.nodes[b], fresh)
        assert written_by_b is not None and written_by_b["mac"] == new.host.mac

        rack.nodes[a].start(timeout=60)
        wait_until(lambda: caught_up(rack, b, a), 20, "A to catch up with B", detail=rack.logs)
        assert rack.actives() == [b], detail(rack)()
        assert state_of(rack.nodes[a])["lsn"] == state_of(rack.nodes[b])["lsn"]
        assert on(rack.nodes[a], fresh) == written_by_b  # replicated, before the hand-over

        rack.nodes[a].cli("ha", "promote")  # fail-back: B hands the lease over
        wait_until(lambda: rack.actives() == [a], 10, "the hand-over to A", detail=detail(rack))
        wait_until(lambda: rack.has_vip(a) and not rack.has_vip(b), 5, "the VIP on A only")
        epoch_a = rack.nodes[a].ha()["epoch"]
        assert epoch_a > epoch_b

        for client, address in zip(clients, [*addresses, fresh], strict=True):
            renew(client, address, rack.vip)  # only A holds the VIP: A ACKs
            lease = on(rack.nodes[a], address)
            assert lease is not None and lease["mac"] == client.host.mac
        assert rack.actives() == [a] and rack.nodes[a].ha()["epoch"] == epoch_a
        for client in clients:
            events = [e["event"] for e in client.events.all()]
            assert "nak" not in events and "leasefail" not in events, events
        wait_until(lambda: caught_up(rack, a, b), 10, "B to follow A", detail=rack.logs)
    finally:
        for client in clients:
            client.stop()
