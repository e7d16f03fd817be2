"""DHCP in a real rack (two appliances and a witness in namespaces, the VIP on the link:
tests/support/ha_lab.py) with real clients, across a ``kill -9`` of the active:

* clients are told the VIP as server identifier, never an appliance's own address, and
  every reply leaves from it, so renewals (unicast to it) reach whichever appliance
  holds it;
* the lease the active acknowledged is on the standby before the client hears of it;
* after the failover the new active hands that address to nobody else (its pool cursor
  starts over, its table does not), and ACKs the original client's renewal at the VIP;
* the old active, restarted, follows the new one: it has the renewal too.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.dhcplab import Dhclient, Sniffer, Udhcpc, wait_until
from tests.support.ha_lab import Rack
from tests.support.netns import Lab, have_commands

pytestmark = pytest.mark.skipif(
    not have_commands("ip", "udhcpc", "dhclient"), reason="needs iproute2, udhcpc, dhclient"
)


@pytest.fixture
def rack(lab: Lab, tmp_path: Path):
    """Short leases (60 s: the least the schema takes); the client is told to renew."""
    made = Rack(lab, tmp_path, dhcp="lease_time = 60\n")
    try:
        yield made.start()
    finally:
        made.close()


def on(node, address: str) -> dict | None:
    return next((x for x in node.leases() if x["address"] == address), None)


def test_after_a_kill_9_the_new_active_keeps_the_lease_and_renews_it_at_the_vip(
    rack: Rack, lab: Lab, tmp_path: Path
) -> None:
    (first,) = rack.actives()
    second = "b" if first == "a" else "a"
    sniff = Sniffer(rack.client, tmp_path)
    udhcpc = Udhcpc(rack.client, tmp_path / "udhcpc").start()
    try:
        bound = udhcpc.wait("bound", 20)
        address = bound["ip"]
        assert bound["serverid"] == rack.vip  # not the active's own address
        lease = on(rack.nodes[second], address)  # acknowledged, so committed on the standby
        assert lease is not None and lease["mac"] == rack.client.mac

        rack.nodes[first].kill9()
        wait_until(lambda: rack.actives() == [second], 15, "the takeover", detail=rack.logs)
        wait_until(lambda: rack.has_vip(second), 5, "the VIP on the new active")

        # A new client: the new active's pool cursor starts at its first address, which
        # the dead active gave to the first client; the replicated table keeps it.
        dhclient = Dhclient(lab.add_host("d", bare=True), tmp_path / "dhclient").start()
        try:
            other = dhclient.wait_bound(timeout=20)
            assert other["new_ip_address"] != address
            assert other["new_dhcp_server_identifier"] == rack.vip
        finally:
            dhclient.stop()

        # The first client renews by unicast to the VIP: the new active ACKs the same lease.
        renewed = udhcpc.nudge(signal.SIGUSR1, "renew", timeout=15)
        assert renewed["ip"] == address and renewed["serverid"] == rack.vip
        lease = on(rack.nodes[second], address)
        assert lease is not None and lease["mac"] == rack.client.mac

        # The old active comes back as the standby and follows: it has the renewal.
        rack.nodes[first].start(timeout=60)
        wait_until(lambda: (on(rack.nodes[first], address) or {}).get("expires")
                   == lease["expires"], 20, "the old active to follow")  # fmt: skip
        assert rack.actives() == [second]
        frames = sniff.frames()
        replies = {f["src"] for f in frames if f["dir"] == "in" and f["sport"] == 67}
        assert replies == {rack.vip}  # from whichever appliance held it, never another
        renewals = [f for f in frames if f["dir"] == "out" and f["dport"] == 67
                    and f["src"] == address]  # fmt: skip
        assert renewals and {f["dst"] for f in renewals} == {rack.vip}
    finally:
        udhcpc.stop()
        sniff.stop()
