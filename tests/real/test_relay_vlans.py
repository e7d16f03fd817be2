"""Two dozen VLAN interfaces behind Rackboot's relay (issue 18: "dozens of VLAN
interfaces must work").

::

    [srv] U.x --- upstream link --- U.y [rly] trunk ===== trunk [cli]
    DhcpNode, a subnet per VLAN             v101 10.63.101.1/24   v101 udhcpc
                                            ...                   ...
                                            v124 10.63.124.1/24   v124 udhcpc

The trunk is relay_lab's single client link (``build_router(links=1)``: a veth
from each namespace into the link's bridge, which forwards 802.1Q frames as they
are); on each end an 802.1Q subinterface per VLAN. A kernel without 802.1Q
(``CONFIG_VLAN_8021Q`` unset, as on the 2-vCPU test VM) skips that case and runs
the other: a veth pair per VLAN straight from ``rly`` to ``cli``, the same 24
client-facing interfaces to the relay, without the tags.

The relay's interfaces carry the VLANs' ``.1`` (their ``giaddr``) and a
configured circuit-id each (the server echoes option 82: replies find their
VLAN by it); the client's have no address and a MAC each, so the server sees 24
clients rather than one MAC in 24 subnets. Every other client asks for broadcast
replies (udhcpc ``-B``): the relay sends those as frames through its packet socket
(plugins/relay/linklayer.py), the others by unicast. relay_lab's helpers run unchanged on
a :class:`Router` whose client links are the VLANs: the server's subnets
(``subnets_toml``), its routes back via the relay (``route_via``), the relay's
``[[relay.interfaces]]`` (``RelayNode``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.dhcplab import DhcpNode, Udhcpc
from tests.support.netns import IFNAMSIZ, Host, Lab, have_commands
from tests.support.relay_lab import (
    RelayNode,
    Router,
    assert_bound_in_their_subnets,
    build_router,
    route_via,
    subnets_toml,
)

pytestmark = pytest.mark.skipif(not have_commands("ip", "udhcpc"),
                                reason="needs iproute2 and udhcpc")  # fmt: skip

VLANS = range(101, 125)  # 24 VLAN ids
BOUND_TIMEOUT = 15.0  # udhcpc sends a DISCOVER a second; all 24 run at once
NO_8021Q = "Unknown device type"  # what `ip link add ... type vlan` says without 802.1Q


@dataclass(frozen=True)
class VlanLink:
    """What :class:`Router` reads of a client link: its network (a VLAN has no bridge)."""

    network: ipaddress.IPv4Network


def vlan_network(vid: int) -> ipaddress.IPv4Network:
    # Labs draw their /24s from 10.64-254.x: 10.63.x never overlaps the upstream or trunk.
    return ipaddress.IPv4Network(f"10.63.{vid}.0/24")


def vlan_mac(vid: int) -> str:
    return f"02:18:00:00:{vid >> 8:02x}:{vid & 0xFF:02x}"


def batch(host: Host, commands: list[str]) -> None:
    """``commands`` in one ``ip -batch`` in ``host``'s namespace (one process, not 72);
    skips the test when the kernel has no 802.1Q VLANs."""
    res = host.run(["ip", "-batch", "-"], input="\n".join(commands) + "\n")
    if res.returncode != 0 and NO_8021Q in res.stderr and "type vlan" in commands[0]:
        pytest.skip("the kernel has no 802.1Q VLANs (CONFIG_VLAN_8021Q): `ip link add ... "
                    f"type vlan`: {res.stderr.strip().splitlines()[0]}")  # fmt: skip
    assert res.returncode == 0, f"ip -batch in {host.ns}: {res.stderr}"


def vlan_interfaces(kind: str, relay: Host, client: Host,
                    vids: range = VLANS) -> tuple[list[Host], list[Host]]:  # fmt: skip
    """An interface ``v<id>`` per VLAN in the relay's and the client's namespace, up; the
    relay's with the VLAN's ``.1``, the client's bare with a MAC of its own. ``kind``:

    * ``"8021q"``: 802.1Q subinterfaces of the trunk (``relay`` and ``client``, the two
      ends of relay_lab's client link), as an appliance's VLANs are;
    * ``"veth"``: a veth pair per VLAN between the two namespaces (the trunk stays idle),
      for kernels without 802.1Q: the relay sees as many client-facing interfaces.

    Hosts for them in VLAN order (with the trunk's lab: processes stop with it)."""
    ups, downs, relay_side, client_side = [], [], [], []
    for vid in vids:
        name, network, mac = f"v{vid}", vlan_network(vid), vlan_mac(vid)
        assert len(name) <= IFNAMSIZ
        address = str(network.network_address + 1)
        if kind == "8021q":
            relay_side.append(f"link add link {relay.ifname} name {name} type vlan id {vid}")
            client_side.append(
                f"link add link {client.ifname} name {name} address {mac} type vlan id {vid}"
            )
        else:
            relay_side.append(
                f"link add {name} type veth peer name {name} address {mac} netns {client.ns}"
            )
        relay_side += [f"addr add {address}/{network.prefixlen} dev {name}", f"link set {name} up"]
        client_side.append(f"link set {name} up")
        downs.append(Host(relay.lab, relay.name, relay.ns, name, address, network))
        ups.append(Host(client.lab, client.name, client.ns, name, "", network))
    batch(relay, relay_side)
    batch(client, client_side)
    return downs, ups


def broadcast(i: int) -> tuple[str, ...]:
    """udhcpc's options for the ``i``-th client: every other one asks for broadcast replies."""
    return ("-B",) if i % 2 == 0 else ()


def set_circuit_ids(relay: RelayNode, circuits: dict[str, str]) -> None:
    """A configured ``circuit_id`` in each ``[[relay.interfaces]]`` RelayNode wrote (its
    ``interface`` keys are the same for every interface; these must differ)."""
    text = relay.config.read_text()
    for name, circuit in circuits.items():
        entry = f'name = "{name}"\n'
        assert text.count(entry) == 1, f"{name} in {relay.config}"
        text = text.replace(entry, f'{entry}circuit_id = "{circuit}"\n')
    relay.config.write_text(text)


@pytest.mark.parametrize("kind", ["8021q", "veth"])
def test_two_dozen_vlans_through_the_relay_each_client_from_its_own_subnet(
    lab: Lab, tmp_path: Path, kind: str
) -> None:
    with contextlib.ExitStack() as stack:
        trunk = build_router(lab, stack, links=1)
        client = trunk.links[0].add_host("cli", bare=True)
        downs, clients_on = vlan_interfaces(kind, trunk.downs[0], client)
        router = Router(lab, trunk.up, [VlanLink(d.network) for d in downs], downs)
        srv = lab.add_host("srv")
        route_via(router, srv)
        node = DhcpNode(srv, tmp_path / "server", subnets_toml(router)).start()

        relay = RelayNode(router, tmp_path / "relay", [srv.addr])
        circuits = {down.ifname: f"trunk0/vlan{down.ifname[1:]}" for down in downs}
        set_circuit_ids(relay, circuits)
        relay.check()
        relay.start()

        clients = [Udhcpc(host, tmp_path / f"cli-{host.ifname}", extra=broadcast(i)).start()
                   for i, host in enumerate(clients_on)]  # fmt: skip
        addresses = assert_bound_in_their_subnets(router, clients, BOUND_TIMEOUT)
        for down, udhcpc in zip(downs, clients, strict=True):
            bound = udhcpc.wait("bound")
            assert (bound["interface"], bound["router"]) == (udhcpc.host.ifname, down.addr), bound
            udhcpc.stop()

        # The server saw each VLAN's client through that VLAN's giaddr.
        leases = {lease["address"]: lease for lease in node.leases()}
        for down, udhcpc, address in zip(downs, clients, addresses, strict=True):
            assert leases[address]["mac"] == udhcpc.host.mac, leases[address]
            assert leases[address]["subnet"] == str(down.network), leases[address]
        assert len(set(addresses)) == len(VLANS)

        status = relay.relay_status()
        detail = json.dumps(status)
        assert set(status["interfaces"]) == set(circuits), detail
        for down in downs:
            counts = status["interfaces"][down.ifname]
            assert counts["address"] == down.addr, detail
            # DISCOVER and REQUEST up, OFFER and ACK down, on every VLAN
            assert counts["requests"] >= 2 and counts["replies"] >= 2, (down.ifname, counts)
            assert counts["frames"], (down.ifname, counts)
        assert status["dropped"] == {} and status["send_errors"] == 0, detail
        assert status["frames_refused"] == 0, detail

        # A VLAN deleted and made again while the relay runs (a network reconfigured):
        # its interface has a new index, which the relay learns by its name.
        first = VLANS[0]
        batch(trunk.downs[0], [f"link del v{first}"])
        if kind == "8021q":
            batch(client, [f"link del v{first}"])
        (down,), (up,) = vlan_interfaces(kind, trunk.downs[0], client, range(first, first + 1))
        # Replies broadcast as frames go out on the new interface.
        again = Udhcpc(up, tmp_path / "again", extra=broadcast(0)).start()
        bound = again.wait("bound", BOUND_TIMEOUT)
        assert router.in_pool(0, bound["ip"]), bound
        again.stop()
        status = relay.relay_status()
        assert status["interfaces"][down.ifname]["frames"], status
        assert status["send_errors"] == 0 and status["frames_refused"] == 0, status
        relay.stop()
        node.stop()
