"""The rack's own appliances relay a VLAN to their VIP while serving DHCP (issue 18).

Both appliances of a rack (tests/support/ha_lab.py) are also on a client link and
run the relay there beside their DHCP server (``when = "always"``), relaying to the
rack's VIP with link selection (``giaddr`` = the appliance's own address on the rack
link, RFC 3527). The active's relay hands its requests to its own DHCP server in
process (sent to the VIP they would loop back to no socket of it) and takes the
replies back the same way; the standby's relay sends to the VIP over the rack link
and its DHCP sockets pass the replies to its relay. A client on the client link gets
an address of its subnet; after the active is killed with SIGKILL a new client still
does, through the survivor alone.
"""

from __future__ import annotations

import contextlib
import ipaddress
from pathlib import Path

from tests.support.dhcplab import Udhcpc, wait_until
from tests.support.ha_lab import Rack
from tests.support.netns import Lab

BOUND_TIMEOUT = 15.0


def relay_section(rack: Rack, name: str, interface: str) -> str:
    return (
        f'\n[relay]\nservers = ["{rack.vip}"]\nsource = "{rack.hosts[name].addr}"\n'
        f'[[relay.interfaces]]\nname = "{interface}"\nlink_selection = true\n'
    )


def test_the_rack_relays_a_vlan_to_its_own_vip_across_a_failover(lab: Lab, tmp_path: Path):
    with contextlib.ExitStack() as stack:
        vlan = stack.enter_context(Lab(avoid=(lab,)))
        base = vlan.network.network_address
        subnet = (f'[[dhcp.subnets]]\nnetwork = "{vlan.network}"\n'
                  f'pools = ["{base + 100}-{base + 150}"]\n')  # fmt: skip
        rack = Rack(lab, tmp_path / "rack", dhcp=subnet)
        stack.callback(rack.close)
        for name, node in rack.nodes.items():
            down = vlan.attach(rack.hosts[name])  # the appliance on the client link too
            node.config.write_text(node.config.read_text() + relay_section(rack, name, down.ifname))
        rack.start()

        def counts(name: str) -> dict:
            return rack.nodes[name].status()["relay"]

        first = Udhcpc(vlan.add_host("old", bare=True), tmp_path / "old").start()
        got = first.wait("bound", BOUND_TIMEOUT)
        assert base + 100 <= ipaddress.IPv4Address(got["ip"]) <= base + 150, got
        assert got["serverid"] == rack.vip
        (active,) = rack.actives()
        standby = "b" if active == "a" else "a"
        for name in (active, standby):  # both relayed: in process and over the rack link
            (interface,) = counts(name)["interfaces"].values()
            assert interface["requests"] >= 2 and interface["replies"] >= 2, (name, interface)
            assert not counts(name)["dropped"], counts(name)
        first.stop()

        rack.nodes[active].kill9()
        wait_until(lambda: rack.actives() == [standby], 15, "the takeover", detail=rack.logs)
        second = Udhcpc(vlan.add_host("new", bare=True), tmp_path / "new").start()
        got = second.wait("bound", BOUND_TIMEOUT)
        assert got["serverid"] == rack.vip
        leases = {lease["mac"]: lease for lease in rack.nodes[standby].leases()}
        assert leases[second.host.mac]["address"] == got["ip"]
        assert leases[second.host.mac]["subnet"] == str(vlan.network)
        second.stop()
