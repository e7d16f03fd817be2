"""A request relayed by ISC dhcrelay from a second link: right subnet, option 82 echoed.

Topology (two labs, so two links; the relay is on both)::

    [srv] A.1 ---- bridge A ---- A.2 [rly] B.1 ---- bridge B ---- [cli] (no address)

The server has a route to B via the relay, serves subnet A on its link and
subnet B through the relay's ``giaddr``. dhcrelay adds option 82 (circuit id:
its downstream interface's name, ``-a``) and drops replies whose option 82 is
not its own (``-D``); a capture on the relay's upstream interface shows what
went each way.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from tests.support.dhcplab import (
    DhcpNode,
    Sniffer,
    Udhcpc,
    bootp_fields,
    dhcp_options,
)
from tests.support.netns import Lab, have_commands
from tests.support.relay_lab import Dhcrelay, Router

RELAY_AGENT_INFO = 82


def test_relayed_request_gets_an_address_of_the_relay_subnet_with_option_82_echoed(
    lab: Lab, tmp_path: Path
) -> None:
    if not have_commands("dhcrelay"):
        pytest.skip("dhcrelay is not installed (isc-dhcp-relay, see tests/debian-packages.txt)")
    with Lab(avoid=(lab,)) as far:
        server = lab.add_host("srv")
        relay_up = lab.add_host("rly")
        relay_down = far.attach(relay_up)  # the same namespace, on link B
        client = far.add_host("cli", bare=True)
        server.run(["ip", "route", "add", str(far.network), "via", relay_up.addr], check=True)
        a, b = lab.network.network_address, far.network.network_address
        node = DhcpNode(
            server,
            tmp_path / "node",
            f"""
            [[dhcp.subnets]]
            network = "{lab.network}"
            pools = ["{a + 100}-{a + 150}"]
            [[dhcp.subnets]]
            network = "{far.network}"
            pools = ["{b + 200}-{b + 220}"]
            router = "{relay_down.addr}"
            domain = "far.example"
            """,
        ).start()
        sniff = Sniffer(relay_up, tmp_path)
        router = Router(lab, relay_up, [far], [relay_down])
        relay = Dhcrelay(router, tmp_path, [server.addr], flags=("-a", "-D")).start()

        dhcp = Udhcpc(client, tmp_path / "udhcpc").start()
        got = dhcp.wait("bound", timeout=15)

        address = ipaddress.IPv4Address(got["ip"])
        assert b + 200 <= address <= b + 220, f"{address} is not from the relay's subnet"
        assert got["router"] == relay_down.addr and got["domain"] == "far.example"
        assert got["serverid"] == server.addr
        (lease,) = node.leases()
        assert (lease["address"], lease["mac"]) == (str(address), client.mac)
        assert lease["subnet"] == str(far.network)

        frames = sniff.stop()
        requests = {}  # xid -> option 82 as the relay sent it
        replies = []
        for frame in frames:
            fields = bootp_fields(frame["payload"])
            if frame["dir"] == "out" and frame["dst"] == server.addr and fields["op"] == 1:
                assert fields["giaddr"] == relay_down.addr
                requests[fields["xid"]] = dhcp_options(frame["payload"])[RELAY_AGENT_INFO]
            elif frame["dir"] == "in" and frame["src"] == server.addr and fields["op"] == 2:
                # Replies go to the relay (giaddr), server port to server port.
                assert (frame["dst"], frame["sport"], frame["dport"]) == (
                    relay_down.addr, 67, 67,
                )  # fmt: skip
                replies.append((fields, dhcp_options(frame["payload"])))
        # dhcrelay -a: circuit id (sub-option 1) = its downstream interface's name.
        circuit = relay_down.ifname.encode()
        assert set(requests.values()) == {bytes([1, len(circuit)]) + circuit}
        kinds = [fields["type"] for fields, _ in replies]
        assert 2 in kinds and 5 in kinds  # OFFER and ACK
        for fields, options in replies:  # echoed unchanged, for the request it answers
            assert options[RELAY_AGENT_INFO] == requests[fields["xid"]]

        dhcp.stop()
        relay.stop()
        node.stop()
