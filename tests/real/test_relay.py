"""Rackboot's DHCP relay (plugins/relay) in a router topology (tests/support/relay_lab.py).

A relay namespace sits on an upstream link (the server) and on three client links (three
subnets); ``rackboot run`` with only the relay plugin relays for bare clients running
udhcpc. Servers: Rackboot's DHCP server, Kea, dnsmasq and a rack whose VIP fails over
while relaying. Hostile replies are crafted with scapy and must be dropped and counted.
A relayed machine's iPXE script and token are answered only to its leased address.

The three-subnet tests capture on the relay's own interfaces: its upstream one shows what
it sent the server (``giaddr``, option 82), its client-link ones what reached the clients.
"""

from __future__ import annotations

import collections
import contextlib
import json
from pathlib import Path

import pytest

from tests.support.dhcplab import (
    DhcpNode,
    Sniffer,
    Timeout,
    Udhcpc,
    bootp_fields,
    dhcp_options,
    wait_until,
)
from tests.support.ha_lab import Rack
from tests.support.netns import Lab, have_commands
from tests.support.relay_lab import (
    SERVERS,
    RelayNode,
    Router,
    assert_bound_in_their_subnets,
    bootreply,
    build_router,
    forward,
    route_via,
    send_reply,
    start_clients,
    subnets_toml,
)

pytestmark = pytest.mark.skipif(not have_commands("ip", "ss", "udhcpc", "curl"),
                                reason="needs iproute2, udhcpc, curl")  # fmt: skip

RELAY_AGENT_INFO = 82
OFFER, ACK = 2, 5
BOUND_TIMEOUT = 15.0  # udhcpc sends a DISCOVER a second


def start_relay(router: Router, workdir: Path, servers: list[str], **kw: str) -> RelayNode:
    relay = RelayNode(router, workdir, servers, **kw)
    relay.check()
    return relay.start()


class Captures:
    """Sniffers on the relay's interfaces: upstream and every client link."""

    def __init__(self, router: Router, workdir: Path) -> None:
        self.router = router
        self.up = Sniffer(router.up, workdir)
        self.downs = [Sniffer(down, workdir) for down in router.downs]

    def stop(self) -> None:
        for sniffer in (self.up, *self.downs):
            sniffer.stop()

    def check_relayed(self, server: str) -> None:
        """Upstream: requests to ``server`` from the relay's address, ``giaddr`` = the client
        link's address, option 82 circuit id = its interface's name (the default). Client
        links: an OFFER and an ACK went out on each, by unicast, none with option 82."""
        by_giaddr = {down.addr: down for down in self.router.downs}
        relayed = set()
        for frame in self.up.frames():
            fields = bootp_fields(frame["payload"])
            if frame["dir"] == "out" and fields["op"] == 1:
                sent = (frame["src"], frame["dst"], frame["dport"])
                assert sent == (self.router.up.addr, server, 67)
                down = by_giaddr[fields["giaddr"]]
                circuit = down.ifname.encode()
                option82 = dhcp_options(frame["payload"])[RELAY_AGENT_INFO]
                assert option82[: 2 + len(circuit)] == bytes([1, len(circuit)]) + circuit, option82
                assert bytes.fromhex(frame["payload"])[3] >= 1  # hops
                relayed.add(fields["giaddr"])
        assert relayed == set(by_giaddr), f"requests relayed only for giaddr {relayed}"
        for down, sniffer in zip(self.router.downs, self.downs, strict=True):
            replies = [f for f in sniffer.frames() if f["dir"] == "out"
                       and bootp_fields(f["payload"])["op"] == 2]  # fmt: skip
            kinds = {bootp_fields(f["payload"])["type"] for f in replies}
            assert {OFFER, ACK} <= kinds, f"{down.ifname}: replies {kinds}"
            for frame in replies:
                assert frame["src"] == down.addr and frame["sport"] == 67
                # RFC 2131 §4.1: udhcpc sets no broadcast flag, so by unicast to yiaddr
                fields = bootp_fields(frame["payload"])
                assert not fields["flags"] & 0x8000 and frame["dst"] == fields["yiaddr"], frame
                assert RELAY_AGENT_INFO not in dhcp_options(frame["payload"]), (
                    f"option 82 reached a client on {down.ifname}"
                )


def test_three_subnets_through_the_relay_from_rackboots_server(lab: Lab, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        router = build_router(lab, stack)
        srv = lab.add_host("srv")
        route_via(router, srv)
        node = DhcpNode(srv, tmp_path / "server", subnets_toml(router)).start()
        relay = start_relay(router, tmp_path / "relay", [srv.addr])
        captures = Captures(router, tmp_path)
        clients = start_clients(router, tmp_path)
        addresses = assert_bound_in_their_subnets(router, clients, BOUND_TIMEOUT)
        for client in clients:
            client.stop()
        captures.stop()

        leases = {lease["address"]: lease for lease in node.leases()}
        for link, client, address in zip(router.links, clients, addresses, strict=True):
            assert leases[address]["mac"] == client.host.mac
            assert leases[address]["subnet"] == str(link.network)
        # The ARP entries the relay set to unicast each reply are gone after the send.
        neigh = router.up.run(["ip", "-4", "neigh", "show"], check=True).stdout
        assert not any(client.host.mac in neigh for client in clients), neigh
        captures.check_relayed(srv.addr)
        interfaces = relay.relay_status()["interfaces"]
        assert set(interfaces) == {down.ifname for down in router.downs}
        for down in router.downs:
            counts = interfaces[down.ifname]
            assert counts["address"] == down.addr
            assert counts["requests"] >= 2 and counts["replies"] >= 2, counts
        assert not relay.dropped()
        relay.stop()
        node.stop()


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_three_subnets_through_the_relay_from_a_third_party_server(
    lab: Lab, tmp_path: Path, kind: str
) -> None:
    server_class, program = SERVERS[kind]
    if not have_commands(program):
        pytest.skip(f"{program} is not installed (tests/debian-packages.txt)")
    with contextlib.ExitStack() as stack:
        router = build_router(lab, stack)
        srv = lab.add_host("srv")
        route_via(router, srv)
        server = server_class(srv, tmp_path, router).start()
        relay = start_relay(router, tmp_path / "relay", [srv.addr])
        captures = Captures(router, tmp_path)
        clients = start_clients(router, tmp_path)
        try:
            assert_bound_in_their_subnets(router, clients, BOUND_TIMEOUT)
        except (AssertionError, Timeout) as exc:
            raise AssertionError(f"{exc}\n{kind} log:\n{server.log_text()[-3000:]}") from None
        for i, client in enumerate(clients):
            bound = client.wait("bound")
            assert bound["serverid"] == srv.addr and bound["router"] == router.downs[i].addr
            client.stop()
        captures.stop()
        captures.check_relayed(srv.addr)
        relay.stop()
        server.stop()


def test_a_new_exchange_through_the_relay_succeeds_after_the_vip_fails_over(
    lab: Lab, tmp_path: Path
) -> None:
    with contextlib.ExitStack() as stack:
        router = build_router(lab, stack)
        rack = Rack(lab, tmp_path / "rack", dhcp=subnets_toml(router))
        stack.callback(rack.close)
        route_via(router, rack.hosts["a"], rack.hosts["b"])
        rack.start()
        relay = start_relay(router, tmp_path / "relay", [rack.vip])
        before = start_clients(router, tmp_path, "old")
        assert_bound_in_their_subnets(router, before, BOUND_TIMEOUT)
        assert {c.wait("bound")["serverid"] for c in before} == {rack.vip}

        (first,) = rack.actives()
        second = "b" if first == "a" else "a"
        rack.nodes[first].kill9()
        # New clients at once: their first DISCOVERs are relayed to a VIP nobody holds.
        after = start_clients(router, tmp_path, "new")
        wait_until(lambda: rack.actives() == [second], 15, "the takeover", detail=rack.logs)
        wait_until(lambda: rack.has_vip(second), 5, "the VIP on the new active")
        addresses = assert_bound_in_their_subnets(router, after, BOUND_TIMEOUT)
        assert {c.wait("bound")["serverid"] for c in after} == {rack.vip}
        leases = {lease["address"]: lease for lease in rack.nodes[second].leases()}
        for client, address in zip(after, addresses, strict=True):
            assert leases[address]["mac"] == client.host.mac
        for client in (*before, *after):
            client.stop()
        assert not relay.dropped()
        relay.stop()


def test_hostile_replies_are_dropped_and_counted(lab: Lab, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        router = build_router(lab, stack, links=1)
        (link,), (down,) = router.links, router.downs
        srv, rogue = lab.add_host("srv"), lab.add_host("rogue")
        evil = link.add_host("evil")  # an addressed host on the client link
        client = link.add_host("cli", bare=True)
        relay = start_relay(router, tmp_path / "relay", [srv.addr])
        sniff = Sniffer(client, tmp_path)
        first, _ = router.pool(0)

        def reply(xid: int, giaddr: str) -> bytes:
            return bootreply(xid=xid, chaddr=client.mac, yiaddr=str(first), giaddr=giaddr,
                             circuit_id=down.ifname, server=srv.addr)  # fmt: skip

        def delivered() -> set[int]:
            return {fields["xid"] for f in sniff.frames()
                    if f["src"] == down.addr and (fields := bootp_fields(f["payload"]))["op"] == 2}  # fmt: skip

        # The control: a well-formed reply from the configured server reaches the client link.
        send_reply(srv, srv.addr, router.up.addr, reply(0x1001, down.addr))
        wait_until(lambda: 0x1001 in delivered(), 5, "the control reply on the client link")
        hostile = [  # (why it is dropped, how it is sent)
            ("not_a_server", (evil, evil.addr, down.addr, reply(0x2002, down.addr))),  # client link
            ("not_a_server", (rogue, rogue.addr, router.up.addr, reply(0x3003, down.addr))),
            ("unknown_giaddr", (srv, srv.addr, router.up.addr,
                                reply(0x4004, str(link.network.network_address + 77)))),
        ]  # fmt: skip
        for _, (host, src, dst, payload) in hostile:
            send_reply(host, src, dst, payload)
        wanted = dict(collections.Counter(reason for reason, _ in hostile))
        wait_until(lambda: relay.dropped() == wanted, 5, f"drops counted as {wanted}",
                   detail=lambda: json.dumps(relay.relay_status()))  # fmt: skip
        metrics = relay.metrics().splitlines()
        for reason, count in wanted.items():
            assert f'rackboot_relay_dropped_total{{reason="{reason}"}} {count}.0' in metrics
        # A second control after them: the relay handled the hostile ones before it.
        send_reply(srv, srv.addr, router.up.addr, reply(0x5005, down.addr))
        wait_until(lambda: 0x5005 in delivered(), 5, "the second control reply")
        sniff.stop()
        assert delivered() == {0x1001, 0x5005}
        for frame in sniff.frames():
            if frame["src"] == down.addr:
                assert RELAY_AGENT_INFO not in dhcp_options(frame["payload"])
        assert relay.relay_status()["interfaces"][down.ifname]["replies"] == 2
        relay.stop()


def test_a_relayed_machines_script_and_token_are_bound_to_its_lease(
    lab: Lab, tmp_path: Path
) -> None:
    mac = "52:54:00:18:00:01"
    url_mac = mac.replace(":", "-")
    with contextlib.ExitStack() as stack:
        router = build_router(lab, stack, links=1)
        (link,) = router.links
        srv = lab.add_host("srv")
        route_via(router, srv)
        root = tmp_path / "root"
        root.mkdir()
        httpboot = f'[httpboot]\naddresses = ["{srv.addr}"]\nroot = "{root}"\n'
        node = DhcpNode(srv, tmp_path / "server", subnets_toml(router) + httpboot,
                        disabled=("tftp",)).start()  # fmt: skip
        wait_until(lambda: node.status().get("httpboot", {}).get("listening"), 10,
                   "httpboot listening", detail=node.log_text)  # fmt: skip
        start_relay(router, tmp_path / "relay", [srv.addr])
        machine = link.add_host("mach", bare=True, mac=mac)
        udhcpc = Udhcpc(machine, tmp_path / "udhcpc").start()
        leased = udhcpc.wait("bound", BOUND_TIMEOUT)["ip"]
        assert router.in_pool(0, leased)
        forward(router, machine, 0)  # HTTP after DHCP: routed through the relay namespace
        other = str(link.network.network_address + 250)
        machine.run(["ip", "addr", "add", f"{other}/{link.network.prefixlen}", "dev",
                     machine.ifname], check=True)  # fmt: skip

        def curl(source: str, *args: str) -> tuple[str, str]:
            res = machine.run(["curl", "-sS", "--max-time", "10", "--interface", source,
                               "-w", "\n%{http_code}", *args], timeout=20)  # fmt: skip
            body, _, code = res.stdout.rpartition("\n")
            assert code != "000", res.stderr
            return code, body

        script_url = f"http://{srv.addr}/boot/{url_mac}.ipxe"
        code, script = curl(leased, script_url)
        assert code == "200", script
        params = dict(arg.split("=", 1) for arg in script.split() if arg.startswith("rackboot."))
        events, token = params["rackboot.events"], params["rackboot.token"]
        post = ("-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
                "--data", '{"stage":"relayed","status":"ok"}', events)  # fmt: skip
        code, body = curl(leased, *post)
        assert code == "201", body
        # Another address of the same machine, routed the same way: refused, token unsaid.
        code, body = curl(other, script_url)
        assert code == "403" and token not in body, body
        code, body = curl(other, *post)
        assert code == "403", body
        udhcpc.stop()
