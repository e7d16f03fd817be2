"""Real DHCP clients against a Rackboot node, each in a namespace of the lab.

udhcpc (busybox), dhclient (ISC) and dhcpcd obtain leases with the subnet's
options as *they* decode them; a MAC reservation gets its address and host
name; renew, INIT-REBOOT and release show in the server's lease list; a client
without the broadcast flag gets its OFFER and ACK by L2 unicast.
"""

from __future__ import annotations

import ipaddress
import re
import signal
import time
from pathlib import Path

import pytest

from tests.support.dhcplab import (
    Dhclient,
    Dhcpcd,
    DhcpNode,
    Sniffer,
    Udhcpc,
    bootp_fields,
    wait_until,
)
from tests.support.netns import Host, Lab, have_commands

CLIENTS = {"udhcpc": Udhcpc, "dhclient": Dhclient, "dhcpcd": Dhcpcd}
BOUND = {"udhcpc": "bound", "dhclient": "BOUND", "dhcpcd": "BOUND"}
PROGRAM = {"udhcpc": "udhcpc", "dhclient": "dhclient", "dhcpcd": "dhcpcd"}
OFFER, ACK = 2, 5


def octet(lab: Lab, last: int) -> str:
    return str(lab.network.network_address + last)


def serve(lab: Lab, server: Host, workdir: Path, *, extra: str = "", lease_time: int = 600,
          **node_options):  # fmt: skip
    """A node on ``server`` with one subnet carrying every option the clients report."""
    return DhcpNode(
        server,
        workdir / "node",
        f"""
        lease_time = {lease_time}
        {extra}
        [[dhcp.subnets]]
        network = "{lab.network}"
        pools = ["{octet(lab, 100)}-{octet(lab, 150)}"]
        router = "{server.addr}"
        dns = ["{octet(lab, 53)}", "{octet(lab, 54)}"]
        domain = "rack7.example"
        ntp = ["{octet(lab, 123)}"]
        mtu = 1400
        routes = ["192.168.50.0/24 via {octet(lab, 254)}", "172.16.0.0/12 via {octet(lab, 253)}"]
        """,
        **node_options,
    )


def told(client: str, event: dict[str, str]) -> dict[str, object]:
    """What the client says it was given, in one shape for all three clients."""
    if client == "udhcpc":
        words = event.get("staticroutes", "").split()
        return {
            "address": event["ip"],
            "mask": event["subnet"],
            "router": event.get("router"),
            "dns": event.get("dns", "").split(),
            "domain": event.get("domain"),
            "lease": int(event["lease"]),
            "mtu": int(event["mtu"]) if "mtu" in event else None,
            "ntp": event.get("ntpsrv", "").split(),
            "routes": sorted(zip(words[::2], words[1::2], strict=True)),
            "server": event["serverid"],
            "hostname": event.get("hostname"),
        }
    if client == "dhclient":  # option 121 as the array of bytes we declared it to be
        raw = [int(x) for x in event.get("new_rfc3442_classless_static_routes", "").split()]
        routes = []
        while raw:
            width = raw[0]
            size = (width + 7) // 8
            dest = raw[1 : 1 + size] + [0] * (4 - size)
            gateway = raw[1 + size : 5 + size]
            routes.append((f"{'.'.join(map(str, dest))}/{width}", ".".join(map(str, gateway))))
            raw = raw[5 + size :]
        routes.sort()
    else:
        words = event.get("new_classless_static_routes", "").split()
        routes = sorted(zip(words[::2], words[1::2], strict=True))
    return {
        "address": event["new_ip_address"],
        "mask": event["new_subnet_mask"],
        "router": event.get("new_routers"),
        "dns": event.get("new_domain_name_servers", "").split(),
        "domain": event.get("new_domain_name"),
        "lease": int(event["new_dhcp_lease_time"]),
        "mtu": int(event["new_interface_mtu"]) if "new_interface_mtu" in event else None,
        "ntp": event.get("new_ntp_servers", "").split(),
        "routes": routes,
        "server": event["new_dhcp_server_identifier"],
        "hostname": event.get("new_host_name"),
    }


def addresses_of(host: Host) -> list[str]:
    out = host.run(["ip", "-4", "-o", "addr", "show", "dev", host.ifname], check=True).stdout
    return [line.split()[3] for line in out.splitlines()]


@pytest.mark.parametrize("client", list(CLIENTS))
def test_real_client_gets_a_lease_with_the_subnet_options(
    lab: Lab, tmp_path: Path, client: str
) -> None:
    if not have_commands(PROGRAM[client]):
        pytest.skip(f"{PROGRAM[client]} is not installed (see tests/debian-packages.txt)")
    server = lab.add_host("srv")
    node = serve(lab, server, tmp_path).start()
    host = lab.add_host("cli", bare=True)
    dhcp = CLIENTS[client](host, tmp_path / client).start()

    got = told(client, dhcp.wait(BOUND[client], timeout=15))

    address = ipaddress.IPv4Address(got["address"])
    assert (
        ipaddress.IPv4Address(octet(lab, 100)) <= address <= ipaddress.IPv4Address(octet(lab, 150))
    )
    assert got == {
        "address": str(address),
        "mask": "255.255.255.0",
        "router": server.addr,
        "dns": [octet(lab, 53), octet(lab, 54)],
        "domain": "rack7.example",
        "lease": 600,
        "mtu": 1400,
        "ntp": [octet(lab, 123)],
        "routes": [("172.16.0.0/12", octet(lab, 253)), ("192.168.50.0/24", octet(lab, 254))],
        "server": server.addr,
        "hostname": None,
    }
    # The client configured the address it was given...
    wait_until(lambda: f"{address}/24" in addresses_of(host), 5, "address on the interface")
    # ...and the server's lease list, through the CLI, holds exactly that lease.
    (lease,) = node.cli("leases", "list")
    assert lease["address"] == str(address) and lease["mac"] == host.mac
    assert lease["state"] == "bound" and lease["subnet"] == str(lab.network)
    assert 590 <= lease["remaining"] <= 600
    dhcp.stop()
    node.stop()


def test_reservation_by_mac_gets_its_address_and_hostname(lab: Lab, tmp_path: Path) -> None:
    server = lab.add_host("srv")
    mac = "52:54:00:7a:00:2a"
    fixed = octet(lab, 42)  # outside the pool
    node = serve(
        lab,
        server,
        tmp_path,
        extra=f"""
        [[dhcp.reservations]]
        address = "{fixed}"
        mac = "{mac}"
        hostname = "node42"
        """,
    ).start()
    reserved = lab.add_host("res", bare=True, mac=mac)
    other = lab.add_host("other", bare=True)
    one = Udhcpc(reserved, tmp_path / "reserved").start()
    two = Dhclient(other, tmp_path / "other").start()

    got = told("udhcpc", one.wait("bound"))
    assert (got["address"], got["hostname"]) == (fixed, "node42")
    assert got["router"] == server.addr and got["domain"] == "rack7.example"
    # Another machine on the link gets a pool address, never the reserved one.
    other_address = told("dhclient", two.wait_bound())["address"]
    assert other_address != fixed and other_address.startswith(octet(lab, 0)[:-1])

    leases = {lease["mac"]: lease for lease in node.leases()}
    assert leases[mac]["address"] == fixed and leases[mac]["hostname"] == "node42"
    assert leases[other.mac]["address"] == other_address
    one.stop()
    two.stop()
    node.stop()


# How each client is made to renew now (as it would at T1, 30 s here) and to release.
RENEW = {"udhcpc": (signal.SIGUSR1, "renew"), "dhcpcd": (signal.SIGUSR1, "RENEW")}
RELEASE = {"udhcpc": (signal.SIGUSR2, "deconfig"), "dhcpcd": (signal.SIGALRM, "STOP")}


@pytest.mark.parametrize("client", list(RENEW))
def test_client_renews_and_releases(lab: Lab, tmp_path: Path, client: str) -> None:
    if not have_commands(PROGRAM[client]):
        pytest.skip(f"{PROGRAM[client]} is not installed (see tests/debian-packages.txt)")
    server = lab.add_host("srv")
    node = serve(lab, server, tmp_path, lease_time=60).start()
    host = lab.add_host("cli", bare=True)
    sniff = Sniffer(server, tmp_path)
    dhcp = CLIENTS[client](host, tmp_path / client).start()
    bound = told(client, dhcp.wait(BOUND[client]))
    (first,) = node.leases()
    assert bound["lease"] == 60 and first["address"] == bound["address"]

    # Renew: a REQUEST unicast to the server from the client's address, with ciaddr.
    time.sleep(0.05)  # so the renewed lease starts measurably later
    renewed = told(client, dhcp.nudge(*RENEW[client]))
    assert renewed["address"] == bound["address"] and renewed["lease"] == 60
    (second,) = node.leases()
    assert second["starts"] > first["starts"] and second["expires"] > first["expires"]
    renewing = [
        bootp_fields(f["payload"])
        for f in sniff.frames()
        if f["dir"] == "in" and f["dport"] == 67 and f["src"] == bound["address"]
    ]
    assert renewing and renewing[-1]["ciaddr"] == bound["address"]

    # Release: the lease ends at once but stays listed with --all.
    dhcp.nudge(*RELEASE[client])
    wait_until(lambda: not node.leases(), 5, "the released lease to leave the active list")
    (released,) = node.cli("leases", "list", "--all")
    assert released["address"] == bound["address"] and released["state"] == "released"
    assert released["remaining"] == 0
    sniff.stop()
    dhcp.stop()
    node.stop()


def test_dhclient_reboots_into_its_lease_and_releases_it(lab: Lab, tmp_path: Path) -> None:
    server = lab.add_host("srv")
    node = serve(lab, server, tmp_path, lease_time=60).start()
    host = lab.add_host("cli", bare=True)
    client = Dhclient(host, tmp_path / "dhclient").start()
    bound = told("dhclient", client.wait_bound())
    (first,) = node.leases()
    client.stop()  # SIGTERM: dhclient keeps its lease file and releases nothing

    # Run twice: the second run starts in INIT-REBOOT from its lease file and is ACKed.
    before = len(client.events.all())
    client.start()
    event = client.wait_bound(("REBOOT", "BOUND"), after=before)
    assert event["event"] == "REBOOT", "INIT-REBOOT was not ACKed"
    assert told("dhclient", event)["address"] == bound["address"]
    (second,) = node.leases()
    assert second["address"] == first["address"] and second["starts"] > first["starts"]

    # dhclient -r: DHCPRELEASE.
    client.release()
    wait_until(lambda: not node.leases(), 5, "the released lease to leave the active list")
    (released,) = node.leases(all=True)
    assert released["address"] == bound["address"] and released["state"] == "released"
    node.stop()


def test_reply_to_a_client_without_the_broadcast_flag_is_l2_unicast(
    lab: Lab, tmp_path: Path
) -> None:
    server = lab.add_host("srv")
    node = serve(lab, server, tmp_path).start()
    sniff = Sniffer(server, tmp_path)
    quiet = lab.add_host("uni", bare=True)
    loud = lab.add_host("bcast", bare=True)
    unicast = Udhcpc(quiet, tmp_path / "uni").start()  # udhcpc leaves the flag clear
    uni_address = told("udhcpc", unicast.wait("bound"))["address"]
    broadcast = Udhcpc(loud, tmp_path / "bcast", extra=("-B",)).start()  # -B sets it
    b_address = told("udhcpc", broadcast.wait("bound"))["address"]
    frames = sniff.stop()

    def exchange(mac: str) -> tuple[list[dict], list[dict]]:
        asked = [f for f in frames if f["dir"] == "in" and f["src_mac"] == mac]
        xids = {bootp_fields(f["payload"])["xid"] for f in asked}
        answered = [
            f
            for f in frames
            if f["dir"] == "out" and f["sport"] == 67 and bootp_fields(f["payload"])["xid"] in xids
        ]
        return asked, answered

    asked, answered = exchange(quiet.mac)
    assert asked and all(bootp_fields(f["payload"])["flags"] == 0 for f in asked)
    kinds = [bootp_fields(f["payload"])["type"] for f in answered]
    assert OFFER in kinds and ACK in kinds
    for frame in answered:  # to the client's MAC and offered address; never broadcast
        assert (frame["dst_mac"], frame["dst"], frame["dport"]) == (quiet.mac, uni_address, 68)
    # Through an ARP entry the server set for the send and deleted after it: kept, each
    # would hold a slot of the host's neighbour table for ~8 s (a DISCOVER storm filled it).
    neigh = server.run(["ip", "-4", "neigh", "show", uni_address], check=True).stdout
    assert quiet.mac not in neigh, neigh

    asked, answered = exchange(loud.mac)
    assert asked and all(bootp_fields(f["payload"])["flags"] == 0x8000 for f in asked)
    assert answered and all(
        (f["dst_mac"], f["dst"]) == ("ff:ff:ff:ff:ff:ff", "255.255.255.255") for f in answered
    )
    assert b_address != uni_address
    unicast.stop()
    broadcast.stop()
    node.stop()


def test_client_declining_an_address_in_use_gets_another(lab: Lab, tmp_path: Path) -> None:
    """udhcpc -a ARP-checks the ACKed address; a squatter answers, udhcpc sends DECLINE;
    the server quarantines the address and offers the next one."""
    server = lab.add_host("srv")
    squatter = lab.add_host("squat", octet(lab, 100))  # the pool's first address
    node = serve(lab, server, tmp_path).start()  # probe = "none": it offers .100
    host = lab.add_host("cli", bare=True)
    client = Udhcpc(host, tmp_path / "udhcpc", extra=("-a100",)).start()
    bound = client.wait("bound", timeout=10)
    assert "declining" in client.log.read_text()
    assert bound["ip"] == octet(lab, 101)
    leases = {x["address"]: x for x in node.leases(all=True)}
    assert leases[squatter.addr]["state"] == "declined" and leases[squatter.addr]["mac"] == host.mac
    assert leases[squatter.addr]["remaining"] > 3500  # decline_quarantine: 3600 s
    assert leases[bound["ip"]]["state"] == "bound"
    client.stop()
    node.stop()


def test_one_node_serves_two_links_and_answers_inform(lab: Lab, tmp_path: Path) -> None:
    """Two provisioning interfaces: each link's clients get that link's subnet (a socket
    per interface, SO_BINDTODEVICE), and an INFORM gets the options without a lease."""
    with Lab(avoid=(lab,)) as far:
        server = lab.add_host("srv")
        server_far = far.attach(server)
        b = far.network.network_address
        node = DhcpNode(
            server,
            tmp_path / "node",
            f"""
            [[dhcp.subnets]]
            network = "{lab.network}"
            pools = ["{octet(lab, 100)}-{octet(lab, 150)}"]
            router = "{server.addr}"
            domain = "near.example"
            [[dhcp.subnets]]
            network = "{far.network}"
            pools = ["{b + 100}-{b + 150}"]
            router = "{server_far.addr}"
            domain = "far.example"
            """,
            interfaces=(server.ifname, server_far.ifname),
        ).start()
        near_client = Udhcpc(lab.add_host("near", bare=True), tmp_path / "near").start()
        far_client = Dhclient(far.add_host("far", bare=True), tmp_path / "far").start()
        informer = far.add_host("inf", str(b + 7))  # configured by hand
        inform = Dhcpcd(informer, tmp_path / "inform", extra=("-s", f"{b + 7}/24")).start()

        near = told("udhcpc", near_client.wait("bound"))
        faraway = told("dhclient", far_client.wait_bound())
        informed = inform.wait("INFORM")
        assert (near["router"], near["domain"], near["server"]) == (
            server.addr, "near.example", server.addr,
        )  # fmt: skip
        assert ipaddress.IPv4Address(near["address"]) in lab.network
        assert (faraway["router"], faraway["domain"], faraway["server"]) == (
            server_far.addr, "far.example", server_far.addr,
        )  # fmt: skip
        assert ipaddress.IPv4Address(faraway["address"]) in far.network
        assert (informed["new_routers"], informed["new_domain_name"]) == (
            server_far.addr, "far.example",
        )  # fmt: skip
        assert "new_dhcp_lease_time" not in informed  # RFC 2131: no lease time for INFORM

        leases = {x["address"]: x["subnet"] for x in node.leases()}
        assert leases == {
            near["address"]: str(lab.network),
            faraway["address"]: str(far.network),
        }  # and nothing for the INFORM
        assert node.status()["dhcp"]["interfaces"] == [server.ifname, server_far.ifname]
        for client in (near_client, far_client, inform):
            client.stop()
        node.stop()


def exchange_lines(log: str) -> list[dict[str, str]]:
    """The fields of each `dhcp received|sent` and TFTP `request` line of a node's log."""
    lines = []
    for line in log.splitlines():
        fields = dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line))
        if fields.get("msg") in ('"dhcp received"', '"dhcp sent"', "request"):
            lines.append({k: v.strip('"') for k, v in fields.items()})
    return lines


def test_log_exchanges_logs_each_dhcp_message_and_tftp_request(
    lab: Lab, tmp_path: Path
) -> None:
    """[node] log_exchanges: a line per DHCP message (type, MAC, address, boot file) and
    per TFTP request, as an operator watching a machine boot reads them; off: none."""
    if not have_commands("tftp"):
        pytest.skip("tftp (tftp-hpa) is not installed (see tests/debian-packages.txt)")
    server = lab.add_host("srv")
    root = tmp_path / "tftproot"
    root.mkdir()
    (root / "pxelinux.0").write_bytes(b"loader" * 100)
    extra = f"""
        [dhcp.boot]
        bios = "pxelinux.0"
        [tftp]
        root = "{root}"
        """
    node = serve(lab, server, tmp_path, extra=extra, node="log_exchanges = true",
                 disabled=("httpboot",)).start()  # fmt: skip
    host = lab.add_host("cli", bare=True)
    dhcp = Udhcpc(host, tmp_path / "udhcpc", extra=("-V", "PXEClient:Arch:00000")).start()
    address = told("udhcpc", dhcp.wait("bound", timeout=15))["address"]
    host.run(["tftp", server.addr, "-c", "get", "pxelinux.0", str(tmp_path / "got")],
             check=True, timeout=20)  # fmt: skip

    def logged() -> list[dict[str, str]]:
        return exchange_lines(node.log_text())

    wait_until(lambda: any(f.get("msg") == "request" for f in logged()), 5, "the TFTP line")
    dhcp_lines = [(f["msg"], f["type"]) for f in logged() if f["msg"] != "request"]
    assert dhcp_lines[:4] == [("dhcp received", "DISCOVER"), ("dhcp sent", "OFFER"),
                              ("dhcp received", "REQUEST"), ("dhcp sent", "ACK")]  # fmt: skip
    by_type = {f["type"]: f for f in logged() if "type" in f}
    assert by_type["DISCOVER"]["mac"] == host.mac
    assert by_type["DISCOVER"]["vendor_class"] == "PXEClient:Arch:00000"
    assert by_type["OFFER"]["address"] == by_type["ACK"]["address"] == address
    assert by_type["ACK"]["boot"] == "pxelinux.0" and by_type["ACK"]["mac"] == host.mac
    assert by_type["REQUEST"]["requested"] == address
    (tftp,) = [f for f in logged() if f["msg"] == "request"]
    assert (tftp["file"], tftp["kind"], tftp["client"].split(":")[0]) == (
        "pxelinux.0", "RRQ", address)  # fmt: skip
    dhcp.stop()
    node.stop()

    # The default: the same exchange logs no such line.
    quiet = serve(lab, server, tmp_path / "quiet", extra=extra, disabled=("httpboot",)).start()
    again = Udhcpc(host, tmp_path / "udhcpc2").start()
    again.wait("bound", timeout=15)
    assert exchange_lines(quiet.log_text()) == []
    again.stop()
    quiet.stop()
