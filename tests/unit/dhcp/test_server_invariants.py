"""Random client populations against the sans-IO server: the invariants a rack relies on."""

from __future__ import annotations

from ipaddress import IPv4Address

from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.dhcp.codec import parse_untrusted
from plugins.dhcp.leases import LeaseState, LeaseTable
from plugins.dhcp.model import Reservation
from plugins.dhcp.options import MessageType
from plugins.dhcp.server import DhcpServer
from tests.unit.dhcp.clients import ON_LINK, SERVER, config, ip, mac, message, subnet

ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(
            ["discover", "select", "init-reboot", "renew", "release", "decline", "wait"]
        ),
        st.integers(0, 11),  # client
        st.integers(0, 11),  # another client's address to ask for
        st.floats(0, 400),  # seconds to wait
    ),
    max_size=80,
)


@settings(deadline=None)  # examples from the profile: ci 200, long 100,000
@given(ACTIONS, st.booleans())
def test_no_address_is_ever_granted_twice(actions, authoritative):
    pool = subnet(pool=("192.0.2.100", "192.0.2.107"))  # fewer addresses than clients
    server = DhcpServer(
        config(
            pool,
            lease_time=300,
            offer_hold=20.0,
            authoritative=authoritative,
            reservations=(Reservation(ip("192.0.2.50"), mac=mac(0)),),
        )
    )
    now = 1_800_000_000.0
    offered: dict[int, int] = {}  # client -> address offered
    holding: dict[int, int] = {}  # client -> address ACKed (as the client believes)
    until: dict[int, float] = {}  # client -> when that lease ends
    journal = []
    for action, who, other, wait in actions:
        hw = mac(who)
        if action == "wait":
            now += wait
            journal.extend(server.sweep(now))
            continue
        if action == "discover":
            data = message(MessageType.DISCOVER, hw)
        elif action == "select":
            address = offered.get(who, ip("192.0.2.100"))
            data = message(
                MessageType.REQUEST, hw, requested=str(IPv4Address(address)), server_id=SERVER
            )
        elif action == "init-reboot":
            target = holding.get(other, holding.get(who, ip("192.0.2.103")))
            data = message(MessageType.REQUEST, hw, requested=str(IPv4Address(target)))
        elif action == "renew":
            data = message(MessageType.REQUEST, hw, ciaddr=str(IPv4Address(holding.get(who, 0))))
        elif action == "release":
            data = message(MessageType.RELEASE, hw, ciaddr=str(IPv4Address(holding.pop(who, 0))))
        else:
            address = holding.pop(who, ip("192.0.2.101"))
            data = message(MessageType.DECLINE, hw, requested=str(IPv4Address(address)))
        outcome = server.handle(data, ON_LINK, now)
        journal.extend(outcome.commits)
        for reply in outcome.replies:
            msg = parse_untrusted(reply.payload)
            if msg.message_type is MessageType.OFFER:
                offered[who] = int(msg.yiaddr)
            elif msg.message_type is MessageType.ACK:
                address = int(msg.yiaddr)
                assert pool.in_pool(address) or (who == 0 and address == ip("192.0.2.50"))
                # Nobody else believes they hold it with an unexpired lease.
                for client, held in list(holding.items()):
                    if client != who and held == address:
                        assert until[client] <= now, "granted an address another client holds"
                        del holding[client]
                holding[who], until[who] = address, now + 300
            elif msg.message_type is MessageType.NAK:
                holding.pop(who, None)
        # Each client holds at most one bound, unexpired lease.
        bound = [
            lease.client
            for lease in server.leases
            if lease.state is LeaseState.BOUND and lease.active(now)
        ]
        assert len(bound) == len(set(bound))

    # Replaying what the journal would hold rebuilds the same table.
    replayed = LeaseTable()
    for lease in journal:
        replayed.apply(lease)
    assert {lease.address: lease for lease in replayed} == {
        lease.address: lease for lease in server.leases
    }
