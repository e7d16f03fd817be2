"""The DHCP lease store on a real state log (appliance/state/store.py): a commit calls back
once the record committed, never when the lease was lost first; the changefeed feeds the
lease table (a reset rebuilds it); a node that may not write writes nothing; an ACK leaves
only once its record committed, which on a rack means the standby acknowledged it; the
journal of an earlier release is imported once."""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from appliance.ha.fence import Fence
from appliance.journal import JournalFile, frame
from appliance.state.records import SnapshotEntry, SnapshotHead
from appliance.state.store import NotWriter, StateStore
from plugins.dhcp.leases import (
    NAMESPACE,
    Lease,
    LeaseState,
    LeaseView,
    address_text,
    encode_lease,
    lease_value,
)
from plugins.dhcp.metrics import DhcpMetrics
from plugins.dhcp.options import MessageType
from plugins.dhcp.server import DhcpServer
from plugins.dhcp.service import DhcpService
from plugins.dhcp.store import SERVERS, LeaseStore
from tests.trio.test_dhcp_shell import FakeSocket
from tests.unit.dhcp.clients import ON_LINK, SERVER, config, ip, mac, message

NOW = 1_000_000.0


def granted_fence() -> Fence:
    fence = Fence(trio.current_time)
    fence.grant(math.inf, epoch=1)
    return fence


def loaded_state(directory: Path, fence: Fence | None = None) -> StateStore:
    state = StateStore(directory, fence or granted_fence())
    state.load()
    return state


@asynccontextmanager
async def running(state: StateStore, *tasks):
    """The state's writer and ``tasks`` (each ``nursery.start``-ed) until the block ends."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(state.run)
            for task in tasks:
                await nursery.start(task)
            yield nursery
            nursery.cancel_scope.cancel()


class Gate:
    """A commit policy that holds commits back as a standby that has not acknowledged would."""

    def __init__(self) -> None:
        self.acknowledged = 0

    def committable(self, durable: int) -> int:
        return min(durable, self.acknowledged)


def bound(n: int, address: str, expires: float = NOW + 600) -> Lease:
    return Lease(ip(address), b"\x01" + mac(n), mac(n), "192.0.2.0/24", LeaseState.BOUND,
                 NOW, expires)  # fmt: skip


async def until(predicate, what: str = "the condition") -> None:
    with trio.fail_after(10):
        while not predicate():
            await trio.sleep(0.001)


async def test_a_commit_calls_back_once_the_last_record_committed_and_the_feed_has_them(
    tmp_path,
):
    state = loaded_state(tmp_path)
    view = LeaseView()
    store = LeaseStore(state, view)
    leases = [bound(n, f"192.0.2.{100 + n}") for n in range(3)]
    durable: list[int] = []
    async with running(state, store.follow):
        for lease in leases:
            view.add(lease)
        store.commit(leases, lambda: durable.append(state.position.lsn))
        assert durable == [] and view.pending() == 3 and len(view.table) == 0
        await until(lambda: durable)
        assert durable == [3]  # once, when the last one committed
        for lease in leases:
            assert state.get(NAMESPACE, address_text(lease.address)) == lease_value(lease)
        await until(lambda: view.table.lsn == 3)
        assert view.pending() == 0 and sorted(view.table, key=lambda x: x.address) == leases
    assert store.counters["committed"] == 3


async def test_a_lease_lost_before_the_commit_calls_no_ack_and_frees_the_address(tmp_path):
    """The standby never acknowledges; the lease is lost: the record is durable here but
    never committed under the lease, so ``on_durable`` never runs."""
    fence = granted_fence()
    gate = Gate()
    state = StateStore(tmp_path, fence, gate)
    state.load()
    view = LeaseView()
    store = LeaseStore(state, view)
    lease = bound(1, "192.0.2.100")
    calls: list[str] = []
    async with running(state):
        view.add(lease)
        store.commit([lease], lambda: calls.append("durable"), lambda: calls.append("abandoned"))
        await until(lambda: state.durable == 1)
        assert calls == [] and not view.is_free_for(lease.address, b"other", NOW)
        fence.revoke()
        state.advance()  # what the next acknowledgement or write does
        assert calls == ["abandoned"] and view.pending() == 0
        later = bound(2, "192.0.2.101")
        view.add(later)
        with pytest.raises(NotWriter):  # and nothing more is written
            store.commit([later])
        assert view.pending() == 0 and state.last() == 1


async def test_the_changefeed_feeds_the_table_and_a_reset_rebuilds_it(tmp_path):
    state = loaded_state(tmp_path)
    first = bound(1, "192.0.2.100")
    await_put = state.put  # written by "another node": the table learns of it by the feed
    view = LeaseView()
    store = LeaseStore(state, view)
    async with running(state, store.follow):
        await await_put(NAMESPACE, "192.0.2.100", lease_value(first))
        await await_put(NAMESPACE, "192.0.2.77", [9, "garbage"])  # counted, skipped
        await until(lambda: view.table.lsn == 2)
        assert list(view.table) == [first] and store.counters["corrupt"] == 1
        await await_put(NAMESPACE, "192.0.2.100", None)  # deleted
        await until(lambda: view.table.lsn == 3)
        assert len(view.table) == 0
        # The leader's snapshot replaces everything: the feed starts over from it.
        second = bound(2, "192.0.2.120")
        head = SnapshotHead(1, 10, 1, ((1, 1),))
        await state.install(head, [SnapshotEntry(NAMESPACE, "192.0.2.120", lease_value(second))])
        await until(lambda: view.table.lsn == 10)
        assert list(view.table) == [second] and store.counters["resets"] == 1


def dhcp_service(state: StateStore, fence: Fence, **server_config):
    server = DhcpServer(config(**server_config), LeaseView())
    registry = CollectorRegistry()
    service = DhcpService(
        server, LeaseStore(state, server.leases), (ON_LINK.interface,),
        DhcpMetrics(registry, server), clock=lambda: NOW, fence=fence.ok,
    )  # fmt: skip
    sock = FakeSocket()
    service.sockets[ON_LINK.interface] = sock
    service.l2_unicast = False
    return service, sock, registry


def handle(service: DhcpService, data: bytes) -> None:
    service._dispatch(data, ON_LINK, service.server.handle(data, ON_LINK, NOW))


def kinds(sock: FakeSocket) -> list[int]:
    return [payload[242] for payload, _ in sock.sent]  # option 53 comes first in our replies


async def test_an_ack_leaves_only_once_the_standby_acknowledged_its_record(tmp_path):
    fence = granted_fence()
    gate = Gate()
    state = StateStore(tmp_path, fence, gate)
    state.load()
    service, sock, _ = dhcp_service(state, fence)
    async with running(state, service.store.follow):
        handle(service, message(MessageType.DISCOVER, mac(1)))
        handle(service, message(MessageType.REQUEST, mac(1), requested="192.0.2.100",
                                server_id=SERVER))  # fmt: skip
        await until(lambda: state.durable == 1)
        await trio.testing.wait_all_tasks_blocked()
        assert kinds(sock) == [MessageType.OFFER]  # durable here, not acknowledged yet
        # Meanwhile another client is not given the address in flight.
        handle(service, message(MessageType.REQUEST, mac(2), requested="192.0.2.100"))
        assert kinds(sock)[-1] == MessageType.NAK
        gate.acknowledged = 1
        state.advance()
        assert kinds(sock)[-1] == MessageType.ACK


async def test_a_standby_writes_nothing(tmp_path):
    """No lease, no record: not for a dynamic client, not for a reservation it answers,
    not for a release, not for an expiry."""
    from plugins.dhcp.model import Reservation

    fence = Fence(trio.current_time)  # never granted
    state = loaded_state(tmp_path, fence)
    service, sock, registry = dhcp_service(
        state, fence, reservations=(Reservation(ip("192.0.2.50"), mac(9)),), lease_time=60,
        vip=SERVER,
    )  # fmt: skip
    service.set_active(False)
    async with running(state, service.store.follow):
        for data in (
            message(MessageType.DISCOVER, mac(1)),
            message(MessageType.REQUEST, mac(1), requested="192.0.2.100"),
            message(MessageType.DISCOVER, mac(9)),
            message(MessageType.REQUEST, mac(9), requested="192.0.2.50", server_id=SERVER),
            message(MessageType.RELEASE, mac(9), ciaddr="192.0.2.50"),
        ):
            handle(service, data)
        assert service.server.sweep(NOW + 3600) == []
        await trio.testing.wait_all_tasks_blocked()
    assert kinds(sock) == [MessageType.OFFER, MessageType.ACK]  # the reservation's answers
    assert state.last() == 0 and service.server.leases.pending() == 0
    # An active server whose fence is closed: the append is refused, nothing is pending.
    service.server.active = True
    handle(service, message(MessageType.REQUEST, mac(2), requested="192.0.2.101"))
    assert state.last() == 0 and service.server.leases.pending() == 0
    assert registry.get_sample_value("rackboot_dhcp_dropped_total", {"reason": "fenced"}) == 1


async def test_becoming_active_announces_this_nodes_server_identifiers(tmp_path):
    fence = granted_fence()
    state = loaded_state(tmp_path, fence)
    service, _, _ = dhcp_service(state, fence)
    service.replicated, service.name, service.own_addresses = True, "a", (ip("192.0.2.2"),)
    service.set_active(False)
    async with running(state, service.store.follow) as nursery:
        nursery.start_soon(service._roles)
        nursery.start_soon(service.store.follow_servers, service._servers_changed)
        await state.put(SERVERS, "b", ["192.0.2.3"])  # the other appliance's, earlier
        service.set_active(True)
        assert not service.server.active  # not before the feed had its turn
        await until(lambda: state.get(SERVERS, "a") == ["192.0.2.2"])
        assert service.server.active
        await until(lambda: ip("192.0.2.3") in service.server.aliases)
        assert ip("192.0.2.2") in service.server.aliases


# -- the journal of an earlier release ----------------------------------------------------


def plant_journal(path: Path, leases: list[Lease]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(frame(encode_lease(lease)) for lease in leases))


async def test_the_old_journal_is_imported_once_the_node_may_write_then_renamed(tmp_path):
    journal = tmp_path / "dhcp" / "leases.journal"
    old = [bound(1, "192.0.2.100"), bound(2, "192.0.2.101"), bound(3, "192.0.2.102")]
    moved = Lease(old[1].address, old[1].client, old[1].hwaddr, old[1].subnet,
                  LeaseState.RELEASED, NOW, NOW + 5)  # fmt: skip
    plant_journal(journal, [*old, moved])
    fence = Fence(trio.current_time)  # a standby first: nothing is imported
    state = loaded_state(tmp_path / "state", fence)
    # The rack already knows a newer lease of client 3 (written since the upgrade).
    server = DhcpServer(config(), LeaseView())
    store = LeaseStore(state, server.leases, legacy=journal)
    service = DhcpService(server, store, (), DhcpMetrics(CollectorRegistry(), server),
                          clock=lambda: NOW, fence=fence.ok, replicated=True)  # fmt: skip
    service.set_active(False)
    await trio.to_thread.run_sync(store.load_legacy)
    assert store.legacy_report["leases"] == 3
    async with running(state, store.follow) as nursery:
        nursery.start_soon(service._roles)
        fence.grant(math.inf, epoch=1)
        await state.put(NAMESPACE, "192.0.2.140", lease_value(bound(3, "192.0.2.140")))
        await trio.testing.wait_all_tasks_blocked()
        assert state.last() == 1 and journal.exists()
        service.set_active(True)
        await until(lambda: not journal.exists())
    assert state.get(NAMESPACE, "192.0.2.100") == lease_value(old[0])
    assert state.get(NAMESPACE, "192.0.2.101") == lease_value(moved)
    assert state.get(NAMESPACE, "192.0.2.102") is None  # client 3's newer lease stands
    assert journal.with_name("leases.journal.imported").exists()
    assert store.legacy is None and store.legacy_report["imported"] == 2
    assert JournalFile(journal.with_name("leases.journal.imported")).open()  # kept as it was
