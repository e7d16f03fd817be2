"""The sans-IO DHCP server, message by message, with explicit time."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from plugins.dhcp.boot import BootChoice
from plugins.dhcp.leases import LeaseState
from plugins.dhcp.model import BootFiles, Reservation
from plugins.dhcp.options import MessageType, Opt, decode_routes, encode_client_arches
from plugins.dhcp.server import Arrival, DhcpServer, Policy
from tests.unit.dhcp.clients import (
    NET,
    ON_LINK,
    RELAY_NET,
    SERVER,
    config,
    ip,
    mac,
    message,
    reply_of,
    subnet,
)

D, R = MessageType.DISCOVER, MessageType.REQUEST
T0 = 1_800_000_000.0
VIP = IPv4Address("192.0.2.5")


def dora(server: DhcpServer, hw: bytes, now: float = T0, arrival: Arrival = ON_LINK, **kw):
    offer = reply_of(server.handle(message(D, hw, **kw), arrival, now))
    assert offer.message_type is MessageType.OFFER
    ack_outcome = server.handle(
        message(R, hw, requested=str(offer.yiaddr), server_id=offer.server_id, **kw), arrival, now
    )
    return offer, ack_outcome


def test_dora_on_the_link():
    server = DhcpServer(config(lease_time=600))
    offer_out = server.handle(message(D, mac(1)), ON_LINK, T0)
    assert offer_out.received is MessageType.DISCOVER and not offer_out.commits
    offer = reply_of(offer_out)
    assert offer.op == 2 and offer.xid == 1 and offer.yiaddr == IPv4Address("192.0.2.100")
    assert offer.server_id == SERVER and offer.lease_time == 600
    assert offer.options[Opt.RENEWAL_TIME] == (300).to_bytes(4, "big")
    assert offer.options[Opt.REBINDING_TIME] == (525).to_bytes(4, "big")
    assert offer.options[Opt.SUBNET_MASK] == bytes([255, 255, 255, 0])
    assert offer.options[Opt.ROUTER] == SERVER.packed
    assert offer.options[Opt.BROADCAST_ADDRESS] == IPv4Address("192.0.2.255").packed
    # No broadcast flag, no address yet: unicast to yiaddr at the client's MAC.
    sent = offer_out.replies[0]
    assert (sent.address, sent.port, sent.hwaddr) == ("192.0.2.100", 68, mac(1))

    ack_out = server.handle(
        message(R, mac(1), requested="192.0.2.100", server_id=SERVER), ON_LINK, T0 + 1
    )
    ack = reply_of(ack_out)
    assert ack.message_type is MessageType.ACK and ack.yiaddr == IPv4Address("192.0.2.100")
    (lease,) = ack_out.commits
    assert lease.address == ip("192.0.2.100") and lease.client == b"\x01" + mac(1)
    assert (lease.state, lease.starts, lease.expires) == (LeaseState.BOUND, T0 + 1, T0 + 601)
    assert server.leases.get(lease.address) == lease


def test_broadcast_flag_and_non_ethernet_get_broadcast_replies():
    server = DhcpServer(config())
    sent = server.handle(message(D, mac(1), broadcast=True), ON_LINK, T0).replies[0]
    assert (sent.address, sent.port, sent.hwaddr) == ("255.255.255.255", 68, None)


def test_each_client_its_own_address_and_a_returning_client_its_old_one():
    server = DhcpServer(config())
    addresses = {}
    for n in range(5):
        _, ack = dora(server, mac(n))
        addresses[n] = ack.commits[0].address
    assert len(set(addresses.values())) == 5
    # Client 2 releases; a newcomer does not take its address while fresh ones remain.
    server.handle(
        message(MessageType.RELEASE, mac(2), ciaddr=str(IPv4Address(addresses[2]))), ON_LINK, T0
    )
    _, newcomer = dora(server, mac(99))
    assert newcomer.commits[0].address not in addresses.values()
    offer, _ = dora(server, mac(2), now=T0 + 10)
    assert int(offer.yiaddr) == addresses[2]


def test_offers_are_held_then_freed():
    server = DhcpServer(config(subnet(pool=("192.0.2.100", "192.0.2.100")), offer_hold=5.0))
    assert reply_of(server.handle(message(D, mac(1)), ON_LINK, T0)).yiaddr == IPv4Address(
        "192.0.2.100"
    )
    assert server.handle(message(D, mac(2)), ON_LINK, T0 + 1).dropped == "pool-exhausted"
    # Another client cannot REQUEST the held address either.
    nak = reply_of(server.handle(message(R, mac(2), requested="192.0.2.100"), ON_LINK, T0 + 1))
    assert nak.message_type is MessageType.NAK
    server.sweep(T0 + 6)
    assert reply_of(server.handle(message(D, mac(2)), ON_LINK, T0 + 6)).yiaddr == IPv4Address(
        "192.0.2.100"
    )


def test_request_for_another_server_releases_our_offer_silently():
    server = DhcpServer(config(subnet(pool=("192.0.2.100", "192.0.2.100"))))
    server.handle(message(D, mac(1)), ON_LINK, T0)
    out = server.handle(
        message(R, mac(1), requested="192.0.2.100", server_id="192.0.2.254"), ON_LINK, T0
    )
    assert (out.replies, out.dropped) == ([], "chose-another-server")
    assert reply_of(server.handle(message(D, mac(2)), ON_LINK, T0)).yiaddr == IPv4Address(
        "192.0.2.100"
    )


def test_init_reboot():
    server = DhcpServer(config())
    _, ack = dora(server, mac(1))
    held = str(IPv4Address(ack.commits[0].address))
    # Its own lease: ACK. Someone else's: NAK, broadcast. Another network: NAK.
    assert (
        reply_of(server.handle(message(R, mac(1), requested=held), ON_LINK, T0)).message_type
        is MessageType.ACK
    )
    taken = server.handle(message(R, mac(2), requested=held), ON_LINK, T0)
    assert reply_of(taken).message_type is MessageType.NAK
    assert reply_of(taken).options[Opt.MESSAGE] == b"address-taken"
    assert taken.replies[0].address == "255.255.255.255"
    moved = reply_of(server.handle(message(R, mac(3), requested="10.9.9.9"), ON_LINK, T0))
    assert moved.message_type is MessageType.NAK
    # A free pool address with no record (the server lost its disk): granted.
    fresh = reply_of(server.handle(message(R, mac(4), requested="192.0.2.105"), ON_LINK, T0))
    assert fresh.message_type is MessageType.ACK


def test_init_reboot_outside_the_pools_depends_on_authoritative():
    out = DhcpServer(config()).handle(message(R, mac(1), requested="192.0.2.50"), ON_LINK, T0)
    assert reply_of(out).message_type is MessageType.NAK
    quiet = DhcpServer(config(authoritative=False))
    out = quiet.handle(message(R, mac(1), requested="192.0.2.50"), ON_LINK, T0)
    assert (out.replies, out.dropped) == ([], "not-ours")


def test_renewing_extends_the_lease_and_answers_ciaddr():
    server = DhcpServer(config(lease_time=100))
    _, ack = dora(server, mac(1))
    held = str(IPv4Address(ack.commits[0].address))
    out = server.handle(message(R, mac(1), ciaddr=held), ON_LINK, T0 + 50)
    assert reply_of(out).message_type is MessageType.ACK and str(reply_of(out).ciaddr) == held
    assert out.commits[0].expires == T0 + 150
    assert (out.replies[0].address, out.replies[0].port) == (held, 68)
    # Renewing an address it does not hold: NAK.
    other = server.handle(message(R, mac(2), ciaddr=held), ON_LINK, T0 + 50)
    assert reply_of(other).message_type is MessageType.NAK


def test_decline_quarantines_the_address():
    server = DhcpServer(config(decline_quarantine=300))
    offer, ack = dora(server, mac(1))
    out = server.handle(
        message(MessageType.DECLINE, mac(1), requested=str(offer.yiaddr), server_id=SERVER),
        ON_LINK,
        T0 + 1,
    )
    assert out.replies == [] and out.commits[0].state is LeaseState.DECLINED
    assert out.commits[0].expires == T0 + 301
    again = reply_of(server.handle(message(D, mac(1)), ON_LINK, T0 + 2))
    assert again.yiaddr != offer.yiaddr
    assert not server.leases.is_free_for(int(offer.yiaddr), b"\x01" + mac(2), T0 + 2)


def test_release_of_someone_elses_lease_is_ignored():
    server = DhcpServer(config())
    offer, _ = dora(server, mac(1))
    out = server.handle(message(MessageType.RELEASE, mac(2), ciaddr=str(offer.yiaddr)), ON_LINK, T0)
    assert out.dropped == "release-of-unknown-lease" and not out.commits
    out = server.handle(message(MessageType.RELEASE, mac(1), ciaddr=str(offer.yiaddr)), ON_LINK, T0)
    assert out.replies == [] and out.commits[0].state is LeaseState.RELEASED


def test_inform_gets_configuration_without_a_lease():
    server = DhcpServer(config())
    out = server.handle(message(MessageType.INFORM, mac(1), ciaddr="192.0.2.77"), ON_LINK, T0)
    ack = reply_of(out)
    assert ack.message_type is MessageType.ACK and int(ack.yiaddr) == 0
    assert Opt.LEASE_TIME not in ack.options and Opt.ROUTER in ack.options
    assert (out.replies[0].address, out.replies[0].port) == ("192.0.2.77", 68)
    assert not out.commits


def test_subnet_options():
    s = subnet(
        router=SERVER,
        dns=(IPv4Address("192.0.2.53"), IPv4Address("192.0.2.54")),
        domain="rack1.example",
        ntp=(IPv4Address("192.0.2.123"),),
        mtu=9000,
        routes=((IPv4Network("10.0.0.0/8"), IPv4Address("192.0.2.254")),),
        lease_time=120,
    )
    offer = reply_of(DhcpServer(config(s)).handle(message(D, mac(1)), ON_LINK, T0))
    o = offer.options
    assert o[Opt.DNS_SERVERS] == IPv4Address("192.0.2.53").packed + IPv4Address("192.0.2.54").packed
    assert o[Opt.DOMAIN_NAME] == b"rack1.example" and o[Opt.INTERFACE_MTU] == (9000).to_bytes(
        2, "big"
    )
    assert o[Opt.NTP_SERVERS] == IPv4Address("192.0.2.123").packed and offer.lease_time == 120
    assert decode_routes(o[Opt.CLASSLESS_STATIC_ROUTES]) == [
        (IPv4Network("10.0.0.0/8"), IPv4Address("192.0.2.254"))
    ]


def test_reservations_by_mac_and_client_id():
    cid = b"\xffmachine-7"
    server = DhcpServer(
        config(
            reservations=(
                Reservation(ip("192.0.2.50"), mac=mac(1), hostname="node1"),
                Reservation(ip("192.0.2.51"), client_id=cid),
                Reservation(ip("192.0.2.101"), mac=mac(3)),  # inside the pool
            )
        )
    )
    offer, ack = dora(server, mac(1))
    assert offer.yiaddr == IPv4Address("192.0.2.50") and offer.options[Opt.HOSTNAME] == b"node1"
    assert ack.commits[0].hostname == "node1"
    offer, _ = dora(server, mac(2), options={Opt.CLIENT_ID: cid})
    assert offer.yiaddr == IPv4Address("192.0.2.51")
    # A reserved pool address is never handed to someone else.
    for n in range(10, 19):
        dora(server, mac(n))
    assert ip("192.0.2.101") not in {
        lease.address for lease in server.leases if lease.client != b"\x01" + mac(3)
    }
    # The reserved machine asking for another address is told no.
    nak = reply_of(server.handle(message(R, mac(1), requested="192.0.2.100"), ON_LINK, T0))
    assert nak.message_type is MessageType.NAK


def test_standby_answers_reservations_only_with_the_vip_and_writes_nothing():
    server = DhcpServer(config(reservations=(Reservation(ip("192.0.2.50"), mac=mac(1)),), vip=VIP))
    server.active = False
    assert server.handle(message(D, mac(2)), ON_LINK, T0).dropped == "standby"
    assert server.handle(message(R, mac(2), requested="192.0.2.100"), ON_LINK, T0).replies == []
    offer, ack = dora(server, mac(1))
    assert reply_of(ack).message_type is MessageType.ACK and reply_of(ack).server_id == VIP
    assert ack.commits == [] and server.leases.get(ip("192.0.2.50")) is None
    assert ack.replies[0].source == 0  # a standby does not hold the VIP: its own address


def test_a_standby_without_a_vip_stays_silent_even_for_reservations():
    """Its server identifier would be its own address, not the one the active answers with."""
    server = DhcpServer(config(reservations=(Reservation(ip("192.0.2.50"), mac=mac(1)),)))
    server.active = False
    for data in (
        message(D, mac(1)),
        message(R, mac(1), requested="192.0.2.50", server_id=SERVER),
        message(R, mac(1), requested="192.0.2.50"),
        message(MessageType.INFORM, mac(1), ciaddr="192.0.2.50"),
    ):
        out = server.handle(data, ON_LINK, T0)
        assert (out.replies, out.commits, out.dropped) == ([], [], "standby")


def relay_info(*suboptions: tuple[int, bytes]) -> bytes:
    return b"".join(bytes([code, len(value)]) + value for code, value in suboptions)


def test_relayed_requests_pick_the_subnet_and_go_back_to_the_relay():
    remote = subnet(
        RELAY_NET, pool=("198.51.100.10", "198.51.100.20"), router=IPv4Address("198.51.100.1")
    )
    server = DhcpServer(config(subnet(), remote))
    agent = relay_info((1, b"port-7"), (2, b"switch-3"))
    kw = {"giaddr": "198.51.100.1", "options": {Opt.RELAY_AGENT_INFO: agent}}
    offer_out = server.handle(message(D, mac(1), **kw), ON_LINK, T0)
    offer = reply_of(offer_out)
    assert offer.yiaddr in RELAY_NET and offer.giaddr == IPv4Address("198.51.100.1")
    assert offer.options[Opt.RELAY_AGENT_INFO] == agent  # echoed unchanged
    assert offer.options[Opt.ROUTER] == IPv4Address("198.51.100.1").packed
    sent = offer_out.replies[0]
    assert (sent.address, sent.port, sent.hwaddr) == ("198.51.100.1", 67, None)
    _, ack = dora(server, mac(1), **kw)
    assert reply_of(ack).options[Opt.RELAY_AGENT_INFO] == agent
    nak_out = server.handle(message(R, mac(5), requested="10.1.1.1", **kw), ON_LINK, T0)
    nak = reply_of(nak_out)
    assert nak.message_type is MessageType.NAK and nak.broadcast
    assert nak_out.replies[0].address == "198.51.100.1"


def test_link_selection_suboption_overrides_giaddr():
    remote = subnet(RELAY_NET, pool=("198.51.100.10", "198.51.100.20"))
    server = DhcpServer(config(subnet(), remote))
    agent = relay_info((1, b"p"), (5, IPv4Address("198.51.100.1").packed))
    out = server.handle(
        message(D, mac(1), giaddr="192.0.2.1", options={Opt.RELAY_AGENT_INFO: agent}), ON_LINK, T0
    )
    assert reply_of(out).yiaddr in RELAY_NET
    assert out.replies[0].address == "192.0.2.1"  # still answered through the relay
    # A truncated sub-option is not trusted: giaddr decides.
    bad = b"\x05\x04\xc6"
    out = server.handle(
        message(D, mac(2), giaddr="192.0.2.1", options={Opt.RELAY_AGENT_INFO: bad}), ON_LINK, T0
    )
    assert reply_of(out).yiaddr in NET


def test_unknown_link_and_garbage_are_dropped_with_a_reason():
    server = DhcpServer(config())
    stranger = Arrival("eth9", ip("10.0.0.1"), ("0.0.0.0", 68))
    assert server.handle(message(D, mac(1)), stranger, T0).dropped == "no-subnet"
    assert server.handle(b"\x01" * 100, ON_LINK, T0).dropped == "malformed:too-short"
    reply = bytearray(message(D, mac(1)))
    reply[0] = 2
    assert server.handle(bytes(reply), ON_LINK, T0).dropped == "not-a-request"


@pytest.mark.parametrize(
    ("vendor", "arch", "user_class", "file", "echo"),
    [
        (b"PXEClient:Arch:00000:UNDI:002001", 0, None, b"undionly.kpxe", b"PXEClient"),
        (b"PXEClient:Arch:00007:UNDI:003016", 7, None, b"ipxe.efi", b"PXEClient"),
        (b"PXEClient:Arch:00009:UNDI:003016", 9, None, b"ipxe.efi", b"PXEClient"),
        (b"PXEClient:Arch:00006:UNDI:003016", 6, None, b"ipxe-i386.efi", b"PXEClient"),
        (b"PXEClient:Arch:00011:UNDI:003016", 0x0B, None, b"ipxe-arm64.efi", b"PXEClient"),
        (
            b"HTTPClient:Arch:00016:UNDI:003001",
            0x10,
            None,
            b"http://192.0.2.1/boot/ipxe.efi",
            b"HTTPClient",
        ),
        (
            b"HTTPClient:Arch:00019:UNDI:003001",
            0x13,
            None,
            b"http://192.0.2.1/boot/ipxe-arm64.efi",
            b"HTTPClient",
        ),
        (
            b"PXEClient:Arch:00000:UNDI:002001",
            0,
            b"\x04iPXE",
            b"http://192.0.2.1/boot/52-54-00-00-ab-cd.ipxe",
            b"PXEClient",
        ),
        (None, None, b"\x04iPXE", b"http://192.0.2.1/boot/52-54-00-00-ab-cd.ipxe", None),
        (b"MSFT 5.0", None, None, None, None),
        (None, None, None, None, None),
        (b"PXEClient:Arch:00099:UNDI:003016", 99, None, None, None),
    ],
)
def test_boot_table(vendor, arch, user_class, file, echo):
    options = {}
    if vendor:
        options[Opt.VENDOR_CLASS] = vendor
    if arch is not None:
        options[Opt.CLIENT_ARCH] = encode_client_arches([arch])
    if user_class:
        options[Opt.USER_CLASS] = user_class
    offer = reply_of(
        DhcpServer(config()).handle(message(D, mac(0xABCD), options=options), ON_LINK, T0)
    )
    assert offer.options.get(Opt.BOOTFILE_NAME) == file
    assert offer.options.get(Opt.VENDOR_CLASS) == echo
    if file:
        assert offer.siaddr == SERVER and offer.options[Opt.TFTP_SERVER_NAME] == b"192.0.2.1"
        assert offer.file == file
    else:
        assert int(offer.siaddr) == 0


PXE_BIOS = {Opt.VENDOR_CLASS: b"PXEClient:Arch:00000:UNDI:002001", Opt.CLIENT_ARCH: b"\0\0"}


def test_boot_overrides_reservation_subnet_and_boot_server():
    s = subnet(boot=BootFiles(bios="rack/undionly.kpxe"), boot_server=IPv4Address("192.0.2.9"))
    server = DhcpServer(
        config(s, reservations=(Reservation(ip("192.0.2.60"), mac=mac(7), boot_file="special.0"),))
    )
    offer = reply_of(server.handle(message(D, mac(1), options=PXE_BIOS), ON_LINK, T0))
    assert offer.options[Opt.BOOTFILE_NAME] == b"rack/undionly.kpxe"
    assert offer.siaddr == IPv4Address("192.0.2.9")
    offer = reply_of(server.handle(message(D, mac(7), options=PXE_BIOS), ON_LINK, T0))
    assert offer.options[Opt.BOOTFILE_NAME] == b"special.0"
    vip = DhcpServer(config(boot_server=IPv4Address("192.0.2.250")))
    offer = reply_of(vip.handle(message(D, mac(1), options=PXE_BIOS), ON_LINK, T0))
    assert offer.siaddr == IPv4Address("192.0.2.250") and offer.server_id == SERVER


def test_policy_hooks_decide_hosts_boot_and_options():
    class Inventory(Policy):
        def host(self, mac_text, client_id):
            return (
                Reservation(ip("192.0.2.42"), hostname="from-inventory")
                if mac_text.endswith("09")
                else None
            )

        def boot(self, request, default):
            return default if request.arches else None

        def reply_options(self, request, reply, lease):
            reply.options[224] = b"site-specific"

    server = DhcpServer(config(), policy=Inventory())
    offer = reply_of(server.handle(message(D, mac(9), options=PXE_BIOS), ON_LINK, T0))
    assert offer.yiaddr == IPv4Address("192.0.2.42") and offer.options[224] == b"site-specific"
    assert offer.options[Opt.BOOTFILE_NAME] == b"undionly.kpxe"
    no_arch = {Opt.VENDOR_CLASS: PXE_BIOS[Opt.VENDOR_CLASS]}
    offer = reply_of(server.handle(message(D, mac(1), options=no_arch), ON_LINK, T0))
    assert Opt.BOOTFILE_NAME not in offer.options


def test_boot_policy_is_asked_about_os_clients_only_when_it_may_answer_them():
    asked = []

    class Everyone(Policy):  # overrides boot: asked about every client by default
        def boot(self, request, default):
            asked.append(request.mac)
            return BootChoice("site", "os-installer.efi", SERVER)

    class Booters(Everyone):  # says it only answers clients that ask to boot
        def boots_any_client(self):
            return False

    assert not Policy().boots_any_client() and Everyone().boots_any_client()
    offer = reply_of(
        DhcpServer(config(), policy=Everyone()).handle(message(D, mac(1)), ON_LINK, T0)
    )
    assert offer.options[Opt.BOOTFILE_NAME] == b"os-installer.efi" and len(asked) == 1
    offer = reply_of(DhcpServer(config(), policy=Booters()).handle(message(D, mac(2)), ON_LINK, T0))
    assert Opt.BOOTFILE_NAME not in offer.options and len(asked) == 1
    offer = reply_of(
        DhcpServer(config(), policy=Booters()).handle(
            message(D, mac(3), options=PXE_BIOS), ON_LINK, T0
        )
    )
    assert offer.options[Opt.BOOTFILE_NAME] == b"os-installer.efi" and len(asked) == 2


def test_pool_exhaustion_then_reuse_of_expired_leases():
    server = DhcpServer(config(subnet(pool=("192.0.2.100", "192.0.2.101")), lease_time=60))
    dora(server, mac(1))
    dora(server, mac(2))
    assert server.handle(message(D, mac(3)), ON_LINK, T0).dropped == "pool-exhausted"
    expired = server.sweep(T0 + 61)
    assert {lease.state for lease in expired} == {LeaseState.EXPIRED}
    offer, ack = dora(server, mac(3), now=T0 + 61)
    assert reply_of(ack).message_type is MessageType.ACK


def test_conflict_probe_before_offering():
    server = DhcpServer(config(probe=True))
    out = server.handle(message(D, mac(1)), ON_LINK, T0)
    assert out.probe == ip("192.0.2.100") and not out.replies
    quarantine = server.probe_result(out.probe, True, T0)
    assert quarantine.state is LeaseState.DECLINED
    out = server.handle(message(D, mac(1)), ON_LINK, T0)
    assert out.probe == ip("192.0.2.101")
    assert server.probe_result(out.probe, False, T0) is None
    assert reply_of(server.handle(message(D, mac(1)), ON_LINK, T0)).yiaddr == IPv4Address(
        "192.0.2.101"
    )


def test_loopback_development_replies_go_to_the_sender():
    lo = Arrival("lo", ip("127.0.0.1"), ("127.0.0.1", 40000), loopback=True)
    server = DhcpServer(
        config(subnet(IPv4Network("127.0.0.0/8"), pool=("127.0.100.10", "127.0.100.20")))
    )
    out = server.handle(message(D, mac(1)), lo, T0)
    assert (out.replies[0].address, out.replies[0].port) == ("127.0.0.1", 40000)
