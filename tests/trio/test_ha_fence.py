"""The fence at the plugins' send paths: a reply decided while active leaves only while
the lease holds; a standby's own answers (reservations) do not need it."""

from __future__ import annotations

import trio
from prometheus_client import CollectorRegistry

from appliance.ha.fence import Fence
from plugins.dhcp.metrics import DhcpMetrics
from plugins.dhcp.model import Reservation
from plugins.dhcp.options import MessageType
from plugins.dhcp.server import DhcpServer
from plugins.dhcp.service import DhcpService
from plugins.dhcp.store import LeaseStore
from tests.trio.test_dhcp_shell import FakeSocket
from tests.unit.dhcp.clients import ON_LINK, config, ip, mac, message

NOW = 1_000_000.0


def dhcp(tmp_path, fence: Fence):
    server = DhcpServer(config(reservations=(Reservation(ip("192.0.2.50"), mac(9)),)))
    registry = CollectorRegistry()
    service = DhcpService(
        server, LeaseStore(tmp_path / "leases.journal"), (ON_LINK.interface,),
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


async def test_a_standby_answers_its_reservations_without_the_lease(tmp_path):
    fence = Fence(trio.current_time)  # never granted
    service, sock, _ = dhcp(tmp_path, fence)
    service.server.active = False
    discover(service, mac(9))  # reserved
    discover(service, mac(3))  # dynamic: the standby stays silent
    assert len(sock.sent) == 1 and fence.refused == 0


async def test_tftp_requests_to_the_vip_are_served_only_under_the_lease(tmp_path):
    """TFTP answers on every node, from its own addresses; from the VIP only while it holds."""
    from plugins.tftp.server import ServerConfig, TftpServer
    from plugins.tftp.stats import Stats

    (tmp_path / "boot.bin").write_bytes(b"x" * 100)
    fence = Fence(trio.current_time)
    fence.vip = "127.0.0.1"  # the loopback stands in for the rack's VIP
    server = TftpServer(ServerConfig(root=tmp_path, port=0), Stats(), None, fence.may_send_from)
    rrq = b"\x00\x01boot.bin\x00octet\x00"

    async def ask(port: int) -> bytes | None:
        with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
            await sock.sendto(rrq, ("127.0.0.1", port))
            with trio.move_on_after(0.5):
                return await sock.recv(2048)
        return None

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            ((_, port),) = await nursery.start(server.serve)
            assert await ask(port) is None and server.fenced == 1
            fence.grant(trio.current_time() + 5)
            assert (await ask(port))[:4] == b"\x00\x03\x00\x01"  # DATA block 1
            nursery.cancel_scope.cancel()


async def test_a_fence_closed_during_the_group_commit_sends_no_ack_and_announces_nothing(
    tmp_path,
):
    """A lease made durable while the fence closed: no ACK, no dhcp_lease_committed."""
    from plugins.dhcp.options import MessageType as T

    fence = Fence(trio.current_time)
    service, sock, registry = dhcp(tmp_path, fence)
    service.store.load()
    events: list = []
    service.events = events.append
    fence.grant(trio.current_time() + 5)
    discover(service, mac(4))
    offer = sock.sent[-1][0]
    yiaddr = ".".join(str(b) for b in offer[16:20])
    request = message(T.REQUEST, mac(4), requested=ip(yiaddr), server_id=ON_LINK.local)
    service._dispatch(request, ON_LINK, service.server.handle(request, ON_LINK, NOW))
    fence.revoke()  # the lease is lost while the record is being made durable
    assert service.store.committer.pending == 1
    await service.store.committer.flush()  # durable now; the ACK meets a closed fence
    assert len(sock.sent) == 1 and events == []  # the OFFER only
    assert registry.get_sample_value("rackboot_dhcp_dropped_total", {"reason": "fenced"}) == 1


async def test_a_decision_made_while_active_is_not_journaled_after_the_fence_closed(tmp_path):
    from plugins.dhcp.options import MessageType as T

    fence = Fence(trio.current_time)
    service, sock, _ = dhcp(tmp_path, fence)
    fence.grant(trio.current_time() + 5)
    discover(service, mac(5))
    yiaddr = ".".join(str(b) for b in sock.sent[-1][0][16:20])
    request = message(T.REQUEST, mac(5), requested=ip(yiaddr), server_id=ON_LINK.local)
    outcome = service.server.handle(request, ON_LINK, NOW)  # decided while active
    assert outcome.commits
    fence.revoke()
    service._dispatch(request, ON_LINK, outcome)
    assert service.store.committer.pending == 0 and len(sock.sent) == 1


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
