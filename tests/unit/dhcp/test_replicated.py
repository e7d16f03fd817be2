"""The server on the replicated state log, sans-IO: the committed table changes only when
a record commits, the pending overlay keeps decisions in flight from being given twice,
the rack's VIP is the server identifier, a standby answers only what the active would
and writes nothing, and a REQUEST naming another appliance of the rack is answered."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.dhcp.leases import (
    CorruptRecord,
    Lease,
    LeaseState,
    LeaseTable,
    LeaseView,
    address_of,
    address_text,
    lease_from_state_untrusted,
    lease_value,
)
from plugins.dhcp.model import Reservation
from plugins.dhcp.options import MessageType, Opt
from plugins.dhcp.server import DhcpServer
from tests.unit.dhcp.clients import ON_LINK, SERVER, config, ip, mac, message, reply_of, subnet

D, R = MessageType.DISCOVER, MessageType.REQUEST
T0 = 1_800_000_000.0
VIP = IPv4Address("192.0.2.5")
OLD_ACTIVE = IPv4Address("192.0.2.2")  # the other appliance's own address
PXE_BIOS = {Opt.VENDOR_CLASS: b"PXEClient:Arch:00000:UNDI:002001", Opt.CLIENT_ARCH: b"\0\0"}
HTTP_X64 = {Opt.VENDOR_CLASS: b"HTTPClient:Arch:00016:UNDI:003001", Opt.CLIENT_ARCH: b"\0\x10"}


def client(n: int) -> bytes:
    return b"\x01" + mac(n)


def lease(address: int, n: int, state=LeaseState.BOUND, starts=T0, expires=T0 + 600) -> Lease:
    return Lease(address, client(n), mac(n), "192.0.2.0/24", state, starts, expires)


def commit_all(server: DhcpServer, commits: list[Lease]) -> None:
    """What the shell and the changefeed do: each record commits, then the table has it."""
    table = server.leases.table
    for record in commits:
        table.lsn += 1
        server.leases.committed(record, table.lsn)
        table.apply(record)
        server.leases.caught_up()


def dora(server: DhcpServer, n: int, now: float = T0, **kw):
    offer = reply_of(server.handle(message(D, mac(n), **kw), ON_LINK, now))
    out = server.handle(
        message(R, mac(n), requested=str(offer.yiaddr), server_id=offer.server_id, **kw),
        ON_LINK,
        now,
    )
    return offer, out


# -- the committed table and the overlay --------------------------------------------------


def test_an_ack_changes_the_view_at_once_and_the_committed_table_only_when_committed():
    server = DhcpServer(config())
    _, out = dora(server, 1)
    (record,) = out.commits
    assert server.leases.get(record.address) == record  # pending: blocks the address
    assert server.leases.table.get(record.address) is None and len(server.leases.table) == 0
    server.leases.committed(record, 1)  # committed, but the changefeed has not applied it yet
    assert server.leases.pending() == 1 and server.leases.get(record.address) == record
    server.leases.table.apply(record)
    server.leases.table.lsn = 1
    server.leases.caught_up()
    assert server.leases.pending() == 0 and server.leases.table.get(record.address) == record


def test_an_address_in_flight_is_given_to_nobody_else():
    """Between the decision and the commit, another client neither gets the address offered
    nor acknowledged; once the commit is abandoned (the lease was lost first), it is free."""
    server = DhcpServer(config(subnet(pool=("192.0.2.100", "192.0.2.101"))))
    _, out = dora(server, 1)
    (record,) = out.commits
    taken = str(IPv4Address(record.address))
    nak = reply_of(server.handle(message(R, mac(2), requested=taken), ON_LINK, T0))
    assert nak.message_type is MessageType.NAK
    offer = reply_of(server.handle(message(D, mac(2), requested=taken), ON_LINK, T0))
    assert offer.yiaddr != IPv4Address(record.address)
    server.handle(message(R, mac(2), requested=str(offer.yiaddr), server_id=SERVER), ON_LINK, T0)
    assert server.handle(message(D, mac(3)), ON_LINK, T0).dropped == "pool-exhausted"
    server.leases.abandon(record)  # never acknowledged
    again = reply_of(server.handle(message(D, mac(3)), ON_LINK, T0))
    assert again.yiaddr == IPv4Address(record.address)


def test_a_client_moving_writes_the_release_of_its_old_address_first():
    server = DhcpServer(config())
    _, first = dora(server, 1)
    commit_all(server, first.commits)
    old = first.commits[0].address
    out = server.handle(message(R, mac(1), requested="192.0.2.107"), ON_LINK, T0 + 5)
    released, bound = out.commits
    assert (released.address, released.state) == (old, LeaseState.RELEASED)
    assert (bound.address, bound.state) == (ip("192.0.2.107"), LeaseState.BOUND)
    assert server.leases.get(old).state is LeaseState.RELEASED
    assert server.leases.table.get(old).state is LeaseState.BOUND  # not committed yet


def test_a_standby_sweeps_offers_but_writes_no_expiry():
    server = DhcpServer(config(lease_time=60))
    _, out = dora(server, 1)
    commit_all(server, out.commits)
    server.active = False
    assert server.sweep(T0 + 61) == [] and server.leases.pending() == 0
    server.active = True
    (expired,) = server.sweep(T0 + 61)
    assert expired.state is LeaseState.EXPIRED and server.leases.pending() == 1
    assert server.sweep(T0 + 62) == []  # in flight already: not written twice


def test_decline_and_release_on_a_standby_write_nothing():
    server = DhcpServer(config(), LeaseTable())
    _, out = dora(server, 1)
    commit_all(server, out.commits)
    held = str(IPv4Address(out.commits[0].address))
    server.active = False
    for data in (
        message(MessageType.RELEASE, mac(1), ciaddr=held),
        message(MessageType.DECLINE, mac(1), requested=held, server_id=SERVER),
    ):
        result = server.handle(data, ON_LINK, T0)
        assert (result.commits, result.dropped) == ([], "standby")


def test_a_new_active_allocates_around_the_replicated_leases():
    """The pool cursor starts at 0 on the node that takes over; the table it was fed
    holds the old active's leases, so the first new client gets none of them."""
    table = LeaseTable()
    for n, address in enumerate(("192.0.2.100", "192.0.2.101", "192.0.2.103")):
        table.apply(lease(ip(address), n))
    server = DhcpServer(config(), table)
    offer = reply_of(server.handle(message(D, mac(9)), ON_LINK, T0))
    assert offer.yiaddr == IPv4Address("192.0.2.102")
    renewed = server.handle(message(R, mac(0), ciaddr="192.0.2.100"), ON_LINK, T0 + 300)
    assert reply_of(renewed).message_type is MessageType.ACK


leases = st.builds(
    Lease,
    st.integers(0, 5),  # few addresses and clients: moves, takeovers, declines
    st.sampled_from([client(n) for n in range(4)]),
    st.just(b"\x52\x54\0\0\0\0"),
    st.just("192.0.2.0/24"),
    st.sampled_from(LeaseState),
    st.floats(0, 100),
    st.floats(0, 200),
)


@settings(deadline=None)
@given(st.lists(leases, max_size=25), st.integers(0, 25), st.floats(0, 200))
def test_the_view_reads_as_if_the_pending_records_were_applied(records, split, now):
    """Committed prefix in the table, the rest pending: every read of the view is the
    table's after applying them all in order; committing them one by one changes nothing
    the view says, and leaves the overlay empty."""
    split = min(split, len(records))
    everything = LeaseTable()
    for record in records:
        everything.apply(record)
    view = LeaseView()
    for record in records[:split]:
        view.table.apply(record)
    for record in records[split:]:
        view.add(record)

    def same() -> None:
        for address in range(6):
            assert view.get(address) == everything.get(address)
            for c in (client(n) for n in range(4)):
                assert view.is_free_for(address, c, now) == everything.is_free_for(address, c, now)
        for c in (client(n) for n in range(4)):
            assert view.of_client(c) == everything.of_client(c)
        assert sorted(view, key=lambda x: x.address) == sorted(everything, key=lambda x: x.address)

    same()
    for lsn, record in enumerate(records[split:], start=split + 1):
        view.committed(record, lsn)
        view.table.apply(record)
        view.table.lsn = lsn
        view.caught_up()
        same()
    assert view.pending() == 0


# -- the state log's value -----------------------------------------------------------------


@given(st.integers(0, 2**32 - 1))
def test_address_keys_round_trip(address):
    assert address_of(address_text(address)) == address
    assert address_text(address) == str(IPv4Address(address))


def test_state_values_round_trip_through_msgpack():
    record = replace(lease(ip("192.0.2.100"), 1), hostname="node-1")
    value = msgpack.unpackb(msgpack.packb(lease_value(record), use_bin_type=True), raw=False)
    assert lease_from_state_untrusted("192.0.2.100", value) == record


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("192.0.2.1", [2, b"", b"", "", 1, 0.0, 0.0, ""]),  # future version
        ("192.0.2.1", [1, "text", b"", "", 1, 0.0, 0.0, ""]),  # client must be bytes
        ("192.0.2.1", [1, b"", b"", "", 9, 0.0, 0.0, ""]),  # unknown state
        ("192.0.2.1", [1, b"", b"", "", 1, 0.0, 0.0]),  # short
        ("192.0.2.1", {"a": 1}),
        ("192.0.2", [1, b"", b"", "", 1, 0.0, 0.0, ""]),  # not an address
        ("192.0.2.256", [1, b"", b"", "", 1, 0.0, 0.0, ""]),
    ],
)
def test_unexpected_state_values_are_corrupt_records(key, value):
    with pytest.raises(CorruptRecord):
        lease_from_state_untrusted(key, value)


# -- the VIP ---------------------------------------------------------------------------------


def test_the_vip_is_the_server_identifier_boot_server_and_reply_source():
    server = DhcpServer(config(vip=VIP))
    offer_out = server.handle(message(D, mac(1), options=PXE_BIOS), ON_LINK, T0)
    offer = reply_of(offer_out)
    assert offer.server_id == VIP and offer.siaddr == VIP
    assert offer.options[Opt.TFTP_SERVER_NAME] == b"192.0.2.5"
    assert offer_out.replies[0].source == int(VIP)
    http = reply_of(server.handle(message(D, mac(2), options=HTTP_X64), ON_LINK, T0))
    assert http.options[Opt.BOOTFILE_NAME] == b"http://192.0.2.5/boot/ipxe.efi"
    _, ack_out = dora(server, 3)
    assert reply_of(ack_out).server_id == VIP and ack_out.replies[0].source == int(VIP)
    nak_out = server.handle(message(R, mac(4), requested="10.0.0.9"), ON_LINK, T0)
    assert reply_of(nak_out).server_id == VIP and nak_out.replies[0].source == int(VIP)
    # A client selecting the VIP's offer is answered; one naming the node's own address
    # (not an appliance of this rack as far as this server knows) chose another server.
    assert reply_of(dora(server, 5)[1]).message_type is MessageType.ACK
    other = server.handle(
        message(R, mac(6), requested="192.0.2.108", server_id=SERVER), ON_LINK, T0
    )
    assert other.dropped == "chose-another-server"


def test_a_standby_answers_a_reservation_exactly_as_the_active_would():
    """Same bytes (server identifier, lease time, boot options), nothing written; only
    where it leaves from differs (the standby does not hold the VIP)."""
    reservations = (Reservation(ip("192.0.2.50"), mac=mac(1), hostname="node-1"),)
    active = DhcpServer(config(reservations=reservations, vip=VIP))
    standby = DhcpServer(config(reservations=reservations, vip=VIP))
    standby.active = False
    for data in (
        message(D, mac(1), options=PXE_BIOS),
        message(R, mac(1), requested="192.0.2.50", server_id=str(VIP), options=PXE_BIOS),
        message(R, mac(1), requested="192.0.2.50", options=PXE_BIOS),
        message(MessageType.INFORM, mac(1), ciaddr="192.0.2.50"),
    ):
        ours, theirs = standby.handle(data, ON_LINK, T0), active.handle(data, ON_LINK, T0)
        assert [r.payload for r in ours.replies] == [r.payload for r in theirs.replies]
        assert len(ours.replies) == 1 and ours.replies[0].source == 0 and not ours.commits
    assert standby.leases.pending() == 0 and len(standby.leases.table) == 0


# -- a REQUEST naming another appliance of the rack ---------------------------------------


def test_a_selecting_request_naming_another_appliance_is_acked_if_its_lease_is_committed():
    """The old active committed the lease and died before its ACK left: the client asks
    again, naming it. The new active ACKs, with the identifier the client chose."""
    table = LeaseTable()
    table.apply(lease(ip("192.0.2.104"), 1))
    server = DhcpServer(config(vip=VIP), table)
    server.aliases = {int(OLD_ACTIVE)}
    data = message(R, mac(1), requested="192.0.2.104", server_id=OLD_ACTIVE)
    out = server.handle(data, ON_LINK, T0 + 10)
    ack = reply_of(out)
    assert ack.message_type is MessageType.ACK and ack.yiaddr == IPv4Address("192.0.2.104")
    assert ack.server_id == OLD_ACTIVE and out.replies[0].source == int(VIP)
    assert out.commits[0].expires == T0 + 10 + 3600


def test_a_selecting_request_naming_another_appliance_without_a_lease_is_naked():
    """The old active's offer died with it: NAK (RFC 2131 §4.3.2), so the client starts over
    at once and gets an offer naming the VIP; the NAK names the server the client chose."""
    server = DhcpServer(config(vip=VIP))
    server.aliases = {int(OLD_ACTIVE)}
    data = message(R, mac(1), requested="192.0.2.100", server_id=OLD_ACTIVE)
    out = server.handle(data, ON_LINK, T0)
    nak = reply_of(out)
    assert nak.message_type is MessageType.NAK and nak.server_id == OLD_ACTIVE
    assert nak.options[Opt.MESSAGE] == b"offered-by-another-appliance" and not out.commits
    offer = reply_of(server.handle(message(D, mac(1)), ON_LINK, T0))
    assert offer.server_id == VIP
    # Someone else's lease named that way: NAKed just the same.
    _, taken = dora(server, 2)
    held = str(IPv4Address(taken.commits[0].address))
    other = server.handle(message(R, mac(3), requested=held, server_id=OLD_ACTIVE), ON_LINK, T0)
    assert reply_of(other).message_type is MessageType.NAK


def test_a_standby_does_not_answer_a_request_naming_another_appliance():
    table = LeaseTable()
    table.apply(lease(ip("192.0.2.104"), 1))
    server = DhcpServer(config(vip=VIP), table)
    server.aliases = {int(OLD_ACTIVE)}
    server.active = False
    data = message(R, mac(1), requested="192.0.2.104", server_id=OLD_ACTIVE)
    assert server.handle(data, ON_LINK, T0).dropped == "standby"


def test_a_decline_naming_another_appliance_is_taken():
    table = LeaseTable()
    table.apply(lease(ip("192.0.2.104"), 1))
    server = DhcpServer(config(vip=VIP), table)
    server.aliases = {int(OLD_ACTIVE)}
    data = message(MessageType.DECLINE, mac(1), requested="192.0.2.104", server_id=OLD_ACTIVE)
    (quarantine,) = server.handle(data, ON_LINK, T0).commits
    assert quarantine.state is LeaseState.DECLINED
