"""The fence at the plugins' points of effect: a reply decided while active leaves only
while the lease holds; a standby's own answers (reservations, only when they are the
active's: the VIP as server identifier) do not need it. DHCP here, its leases on the
state log (which asks the fence at each append); TFTP and HTTP boot, which speak from the
rack's VIP only under the lease, below."""

from __future__ import annotations

import contextlib
import json
import math
import socket
from ipaddress import IPv4Address
from pathlib import Path

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from appliance.ha.fence import Fence
from appliance.state.store import StateStore
from plugins.dhcp.metrics import DhcpMetrics
from plugins.dhcp.model import Reservation
from plugins.dhcp.options import MessageType
from plugins.dhcp.server import DhcpServer
from plugins.dhcp.service import DhcpService
from plugins.dhcp.store import LeaseStore
from plugins.httpboot.connection import Connection, Limits
from plugins.httpboot.identity import machine_token
from plugins.httpboot.machines import MACHINES_NS, Boot, Machines
from plugins.httpboot.messages import Response, Route
from plugins.httpboot.router import Router
from plugins.httpboot.routes import BootPolicy, BuiltinRoutes
from plugins.httpboot.script import Profile
from plugins.httpboot.server import HttpServer
from plugins.httpboot.stats import Stats as HttpStats
from plugins.httpboot.store import EventStore
from plugins.tftp import server as tftp_server
from plugins.tftp.packets import (
    Data,
    Opcode,
    OptionAck,
    encode_ack,
    encode_request,
    parse_untrusted,
)
from plugins.tftp.server import ServerConfig, TftpServer
from plugins.tftp.stats import Stats as TftpStats
from tests.support.http import Client
from tests.support.tftp import fetch
from tests.trio.test_dhcp_shell import FakeSocket
from tests.unit.dhcp.clients import ON_LINK, config, ip, mac, message
from tests.unit.tftp.fakeclient import pattern

NOW = 1_000_000.0


def dhcp(tmp_path, fence: Fence, **server_config):
    server = DhcpServer(config(reservations=(Reservation(ip("192.0.2.50"), mac(9)),),
                               **server_config))  # fmt: skip
    registry = CollectorRegistry()
    state = StateStore(tmp_path / "state", fence)  # its writer runs only where a test starts it
    state.load()
    service = DhcpService(
        server, LeaseStore(state, server.leases), (ON_LINK.interface,),
        DhcpMetrics(registry, server), clock=lambda: NOW, fence=fence.ok,
    )  # fmt: skip
    sock = FakeSocket()
    service.sockets[ON_LINK.interface] = sock
    service.l2_unicast = False
    return service, sock, registry


def discover(service, hw: bytes) -> None:
    data = message(MessageType.DISCOVER, hw)
    service._dispatch(data, ON_LINK, service.server.handle(data, ON_LINK, NOW))


async def test_an_active_node_past_its_lease_sends_no_dynamic_answer(tmp_path):
    fence = Fence(trio.current_time)
    service, sock, registry = dhcp(tmp_path, fence)
    fence.grant(trio.current_time() + 0.5)
    discover(service, mac(1))
    assert len(sock.sent) == 1  # within the lease: the OFFER goes
    await trio.sleep(0.6)  # a pause past the lease; the role has not changed yet
    discover(service, mac(2))
    assert len(sock.sent) == 1
    assert registry.get_sample_value("rackboot_dhcp_dropped_total", {"reason": "fenced"}) == 1
    assert fence.refused == 1


async def test_a_standby_answers_its_reservations_without_the_lease_when_it_has_a_vip(tmp_path):
    """Its answer is then the active's (the VIP as server identifier); it writes nothing."""
    fence = Fence(trio.current_time)  # never granted
    service, sock, registry = dhcp(tmp_path, fence, vip=IPv4Address("192.0.2.5"))
    service.server.active = False
    discover(service, mac(9))  # reserved
    discover(service, mac(3))  # dynamic: the standby stays silent
    assert len(sock.sent) == 1 and fence.refused == 0
    assert service.store.state.last() == 0


async def test_a_standby_without_a_vip_does_not_answer_reservations(tmp_path):
    """Its server identifier would be its own address: not what the active answers."""
    fence = Fence(trio.current_time)
    service, sock, _ = dhcp(tmp_path, fence)
    service.server.active = False
    discover(service, mac(9))
    assert sock.sent == [] and fence.refused == 0


async def test_a_fence_closed_before_the_commit_sends_no_ack_and_announces_nothing(tmp_path):
    """A lease written while active, the lease lost before the record committed (here: while
    it was being made durable): no ACK, no dhcp_lease_committed."""
    from plugins.dhcp.options import MessageType as T

    fence = Fence(trio.current_time)
    service, sock, registry = dhcp(tmp_path, fence)
    state = service.store.state
    events: list = []
    service.events = events.append
    fence.grant(trio.current_time() + 5)
    discover(service, mac(4))
    offer = sock.sent[-1][0]
    yiaddr = ".".join(str(b) for b in offer[16:20])
    request = message(T.REQUEST, mac(4), requested=ip(yiaddr), server_id=ON_LINK.local)
    service._dispatch(request, ON_LINK, service.server.handle(request, ON_LINK, NOW))
    fence.revoke()  # the lease is lost while the record is being made durable
    assert len(state.uncommitted) == 1
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(state.run)
            while state.durable < 1:  # durable now; it does not commit under a lost lease
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    assert len(sock.sent) == 1 and events == []  # the OFFER only
    assert registry.get_sample_value("rackboot_dhcp_dropped_total", {"reason": "fenced"}) == 1
    assert service.server.leases.pending() == 0  # the address is free again


async def test_a_decision_made_while_active_is_not_written_after_the_fence_closed(tmp_path):
    from plugins.dhcp.options import MessageType as T

    fence = Fence(trio.current_time)
    service, sock, registry = dhcp(tmp_path, fence)
    fence.grant(trio.current_time() + 5)
    discover(service, mac(5))
    yiaddr = ".".join(str(b) for b in sock.sent[-1][0][16:20])
    request = message(T.REQUEST, mac(5), requested=ip(yiaddr), server_id=ON_LINK.local)
    outcome = service.server.handle(request, ON_LINK, NOW)  # decided while active
    assert outcome.commits
    fence.revoke()
    service._dispatch(request, ON_LINK, outcome)
    assert service.store.state.last() == 0 and len(sock.sent) == 1
    assert service.server.leases.pending() == 0
    assert registry.get_sample_value("rackboot_dhcp_dropped_total", {"reason": "fenced"}) == 1


async def test_dhcp_starts_inactive_until_the_node_is_active(tmp_path):
    """It started active: a fresh HA standby journaled and announced ACKs it never sent."""
    from appliance.api import Role
    from appliance.node import Node
    from plugins.dhcp.plugin import DhcpPlugin
    from tests.support.plugins import configured

    plugin = DhcpPlugin()
    config, pm = configured(tmp_path, {}, dhcp=plugin)
    node = Node(config, pm)
    node.data_dir.mkdir(parents=True)
    assert node.role is Role.STANDBY
    (service,) = plugin.rackboot_services(node=node)
    assert plugin.service.server.active is False
    node.set_role(Role.ACTIVE)
    assert plugin.service.server.active is True
    node.set_role(Role.STANDBY)
    assert plugin.service.server.active is False


# -- TFTP: the VIP under the lease, the node's own addresses whatever the role ----------
#
# Real loopback sockets and the pump's real thread, so real time with bounded waits
# (trio.fail_after); 127.0.0.1 stands in for the rack's VIP.

VIP = "127.0.0.1"
BLOCKS = 40  # boot.bin: 40 blocks of 512 and an empty final one


def vip_fence(vip: str = VIP) -> Fence:
    """Granted without end; the clock object, as the node gives it: the pump's thread asks too."""
    fence = Fence(trio.lowlevel.current_clock().current_time)
    fence.vip = vip
    fence.grant(math.inf)
    return fence


@contextlib.asynccontextmanager
async def tftp(root: Path, fence: Fence, **config):
    (root / "boot.bin").write_bytes(pattern(0, 512 * BLOCKS))
    server = TftpServer(ServerConfig(root=root, port=0, **config), TftpStats(), None, fence)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            ((_, port),) = await nursery.start(server.serve)
            yield server, (VIP, port)
            nursery.cancel_scope.cancel()


@contextlib.contextmanager
def udp_client():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        sock.bind(("127.0.0.1", 0))
        yield sock


async def receive(sock: socket.socket) -> tuple[object, tuple[str, int]]:
    await trio.lowlevel.wait_readable(sock)
    data, tid = sock.recvfrom(70_000)
    return parse_untrusted(data), tid


def queued(sock: socket.socket) -> int:
    """Datagrams waiting on ``sock`` (read and dropped). Loopback delivers within the
    sender's system call, so this is everything sent to it so far."""
    n = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            sock.recv(70_000)
            n += 1
    return n


def rrq(name: str = "boot.bin", **options: str) -> bytes:
    return encode_request(Opcode.RRQ, name, "octet", options)  # blksize 512 by default


async def test_tftp_requests_to_the_vip_are_served_only_under_the_lease(tmp_path):
    """TFTP answers on every node, from its own addresses; from the VIP only while it holds."""
    fence = vip_fence()
    fence.revoke()
    async with tftp(tmp_path, fence) as (server, address):
        with udp_client() as sock:
            sock.sendto(rrq(), address)
            with trio.move_on_after(0.5):
                await receive(sock)
                raise AssertionError("answered from the VIP without the lease")
            assert server.stats.transfers["fenced"] == 1 and server.stats.active == 0
        fence.grant(math.inf)
        with udp_client() as sock:
            sock.sendto(rrq(), address)
            packet, _ = await receive(sock)
            assert isinstance(packet, Data) and packet.block == 1


@pytest.mark.parametrize("step", ["lock-step ACK", "window ACK", "retransmission"])
async def test_a_vip_transfer_stops_at_its_next_window_once_the_fence_closes(tmp_path, step):
    """The pump asks the fence before each lock-step block (the fast path), each window and
    each retransmission: once the lease is lost nothing more leaves the VIP, not even an
    ERROR, and the transfer ends "fenced", its socket and slot freed."""
    timeout = 0.5 if step == "retransmission" else 10.0  # no retransmission unless asked for
    timers = {"timeout": timeout, "max_timeout": timeout}
    fence = vip_fence()
    async with tftp(tmp_path, fence, **timers) as (server, address):
        with udp_client() as sock:
            if step == "window ACK":
                sock.sendto(rrq(windowsize="4"), address)
                oack, tid = await receive(sock)
                assert isinstance(oack, OptionAck)
                sock.sendto(encode_ack(0), tid)
                blocks = [(await receive(sock))[0].block for _ in range(4)]
                assert blocks == [1, 2, 3, 4]
                last = 4
            else:
                sock.sendto(rrq(), address)
                data, tid = await receive(sock)
                last = 1
                if step == "lock-step ACK":
                    sock.sendto(encode_ack(1), tid)  # DATA 2 by the fast path, fence asked
                    data, _ = await receive(sock)
                    last = 2
                assert isinstance(data, Data) and data.block == last
            assert queued(sock) == 0
            fence.revoke()  # the lease is lost with the transfer in flight
            if step != "retransmission":
                sock.sendto(encode_ack(last), tid)  # asks for the next block or window
            await server.wait_idle()  # the pump handed the job back (the timer, at most 0.5 s)
            assert queued(sock) == 0
        stats = server.stats
        assert stats.transfers["fenced"] == 1 and stats.transfers["timeout"] == 0
        assert stats.bytes_sent == 512 * last and stats.retransmits == 0  # only what went out
        assert stats.errors_sent == {} and not server._jobs
        assert fence.refused == 1


@pytest.mark.parametrize("name", ["boot.bin", "missing.bin"])
async def test_a_fence_closed_while_a_vip_request_is_admitted_sends_nothing(
    tmp_path, monkeypatch, name
):
    """Admission awaits (opening the file in a worker thread); the fence asked on arrival
    no longer holds when the first datagram (DATA, or ERROR 1) would leave the VIP."""
    fence = vip_fence()
    open_root = tftp_server.open_root

    async def lease_lost_meanwhile(root, requested):
        fence.revoke()
        return await open_root(root, requested)

    monkeypatch.setattr(tftp_server, "open_root", lease_lost_meanwhile)
    async with tftp(tmp_path, fence) as (server, address):
        with udp_client() as sock:
            sock.sendto(rrq(name), address)
            await trio.testing.wait_all_tasks_blocked()  # admitted, the file asked for
            await server.wait_idle()
            assert queued(sock) == 0
        assert server.stats.transfers["fenced"] == 1 and server.stats.transfers["refused"] == 0
        assert server.stats.errors_sent == {} and not server._jobs


async def test_transfers_from_the_nodes_own_address_ignore_the_fence(tmp_path):
    fence = vip_fence(vip="127.0.0.2")  # another address is the VIP
    fence.revoke()
    async with tftp(tmp_path, fence) as (server, address):
        fetched = await fetch(address, "boot.bin", {"blksize": "512"})
        await server.wait_idle()
    assert fetched.data == pattern(0, 512 * BLOCKS)
    assert server.stats.transfers["complete"] == 1 and fence.refused == 0


# -- HTTP boot: events under the fence; the VIP answered only by the holder ---------------

EVENTS = "/api/v1/machines/52-54-00-12-34-56/events"
SECRET = b"s" * 32
# the machine's boot, as its script recorded it (the token is made with its nonce)
BOOT = Boot("52:54:00:12:34:56", "0" * 32, "10.0.0.5", None, 0.0)
TOKEN = [("authorization", f"Bearer {machine_token(SECRET, BOOT.mac, BOOT.nonce)}")]
BODY = json.dumps({"stage": "installed", "status": "ok"}).encode()


class HeldCommits:
    """The commit policy of an active whose standby has not acknowledged past ``limit``."""

    def __init__(self) -> None:
        self.limit = 0

    def committable(self, durable: int) -> int:
        return min(durable, self.limit)


def events_api(tmp_path: Path, fence: Fence, stats: HttpStats, announced: list):
    """The built-in routes of an active node over its state store (commits held by hand)."""
    state = StateStore(tmp_path / "state", fence, HeldCommits())
    state.load()
    store = EventStore(state, 16)
    policy = BootPolicy({"default": Profile("default", "vmlinuz", (), "")}, {}, "default")
    routes = BuiltinRoutes(
        root=tmp_path, policy=policy, secret=lambda: SECRET, store=store, stats=stats,
        public_url="", admin_token="", max_event_bytes=4096, is_active=lambda: True,
        status=dict, metrics=CollectorRegistry(), script_hook=lambda **kw: None,
        event_hook=lambda event: announced.append(event),
        machines=Machines(state, reservations={BOOT.mac: BOOT.address}),  # the client's address
    )  # fmt: skip
    return state, store, Router(routes.api())


async def test_an_event_not_committed_when_the_fence_closed_is_not_acknowledged(tmp_path):
    """Appended while active, durable here, waiting for the standby's acknowledgement when
    the lease is lost: no 201, no httpboot_machine_event; the installer retries at the new
    active. Once the fence is closed, nothing more is appended. (The real clock: the fsync
    runs in a worker thread, which the autojump clock would take for idleness.)"""
    fence = Fence(trio.current_time)
    fence.grant(trio.current_time() + 60, 1)
    stats, announced, replies = HttpStats(), [], []
    state, store, router = events_api(tmp_path, fence, stats, announced)
    client_stream, server_stream = trio.testing.memory_stream_pair()
    connection = Connection(
        server_stream, router, Limits(), stats, ("10.0.0.5", 1234), ("10.0.0.1", 80)
    )
    client = Client(client_stream)

    async def post() -> None:
        replies.append(await client.request("POST", EVENTS, TOKEN, BODY))

    async def durable_not_committed() -> None:
        while not (state.uncommitted and state.durable == state.last()):
            await trio.sleep(0.001)

    async with trio.open_nursery() as nursery:
        await nursery.start(state.run)
        await nursery.start(store.follow)
        nursery.start_soon(connection.serve)
        state.append(MACHINES_NS, BOOT.mac, BOOT.value())  # committed before the installer posts
        await durable_not_committed()
        state.policy.limit = state.durable
        state.advance()
        for lose_the_lease in (False, True):
            nursery.start_soon(post)
            await durable_not_committed()  # on disk, the standby's acknowledgement awaited
            assert len(replies) == len(announced) == (1 if lose_the_lease else 0)
            if lose_the_lease:
                fence.revoke()
            state.policy.limit = state.durable  # the standby acknowledges
            state.advance()
            await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(post)  # the node still believes it is active: the fence says no
        await trio.testing.wait_all_tasks_blocked()
        assert not state.uncommitted and state.last() == 3  # the boot, two events: nothing more
        nursery.cancel_scope.cancel()
    assert [reply.status for reply in replies] == [201, 503, 503]
    assert [event.seq for event in announced] == [1]
    assert stats.event_refusals["fenced"] == 2 and sum(stats.events_recorded.values()) == 1
    # a deposed leader keeps its record (cut later if the new leader lacks it)
    assert len(store.table.events("52:54:00:12:34:56")) == 2


@contextlib.asynccontextmanager
async def http(fence: Fence):
    """Serving on 127.0.0.1 (the node's own address) and 127.0.0.2 (the VIP)."""

    async def lease_lost_meanwhile(request):
        await trio.sleep(0)
        fence.revoke()
        return Response.text("too late")

    router = Router(
        [
            Route("GET", "/hello", lambda request: Response.text("hello")),
            Route("GET", "/slow", lease_lost_meanwhile),
        ]
    )
    addresses = (IPv4Address("127.0.0.1"), IPv4Address("127.0.0.2"))
    server = HttpServer(addresses, 0, router, Limits(), HttpStats(), 10, fence=fence)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            yield server, *server.bound
            nursery.cancel_scope.cancel()


async def test_http_requests_to_the_vip_are_answered_only_by_the_holder():
    """A request to the VIP is asked about on arrival and again before its answer leaves:
    on a node that does not hold the lease it gets 503 and the connection is closed. The
    node's own address is served whatever the role."""
    fence = Fence(trio.current_time)
    fence.vip = "127.0.0.2"  # never granted: this node is a standby
    async with http(fence) as (server, own, vip):
        client = await Client.connect(vip)
        refused = await client.request("GET", "/hello")
        assert refused.status == 503 and refused.header(b"retry-after") == b"1"
        assert refused.header(b"connection") == b"close" and await client.closed_by_server()
        await client.aclose()
        client = await Client.connect(own)  # the node's own address: whatever the role
        assert (await client.request("GET", "/hello")).body == b"hello"
        await client.aclose()
        fence.grant(trio.current_time() + 60)  # the holder now
        client = await Client.connect(vip)
        assert (await client.request("GET", "/hello")).status == 200
        fence.revoke()  # lost: the next request on the kept-alive connection is refused
        assert (await client.request("GET", "/hello")).status == 503
        assert await client.closed_by_server()
        await client.aclose()
        fence.grant(trio.current_time() + 60)
        client = await Client.connect(vip)
        assert (await client.request("GET", "/slow")).status == 503  # lost while it ran
        assert await client.closed_by_server()
        await client.aclose()
        assert server.stats.fenced == 3 and server.stats.requests[("GET", 503)] == 3
