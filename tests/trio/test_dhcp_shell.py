"""The DHCP shell's answers to a hostile link, with the kernel faked where the real one
would have to be pushed over a machine-wide limit (tests/real shows the rest):

* a refused ARP entry (ENOBUFS, the neighbour table full after a DISCOVER storm)
  sends that one reply by broadcast and keeps the service up;
* conflict probes: one per address at a time, however often its client asks,
  and at most MAX_PROBES at once.
"""

from __future__ import annotations

import errno
import math
import socket

import trio
from prometheus_client import CollectorRegistry

from appliance.ha.fence import Fence
from appliance.state.store import StateStore
from plugins.dhcp import service as shell
from plugins.dhcp.codec import parse_untrusted
from plugins.dhcp.metrics import DhcpMetrics
from plugins.dhcp.options import MessageType
from plugins.dhcp.server import DhcpServer, Reply
from plugins.dhcp.service import MAX_PROBES, DhcpService
from plugins.dhcp.store import LeaseStore
from tests.unit.dhcp.clients import ON_LINK, config, mac, message, subnet

NOW = 1_000_000.0


class FakeSocket:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple[str, int]]] = []
        self.sources: list[list] = []
        self.deaf = False

    def sendto(self, payload: bytes, address: tuple[str, int]) -> int:
        self.sent.append((payload, address))
        return len(payload)

    def sendmsg(self, buffers, ancdata, flags, address: tuple[str, int]) -> int:
        """As the kernel would: ``ancdata`` says the source (kept in :attr:`sources`)."""
        self.sources.append(ancdata)
        return self.sendto(b"".join(buffers), address)

    def fileno(self) -> int:
        return -1

    def setsockopt(self, level: int, option: int, value) -> None:
        """Only the socket filter of a deaf standby (netio.set_deaf) is asked for here."""
        from plugins.dhcp.netio import SO_ATTACH_FILTER, SO_DETACH_FILTER

        assert level == socket.SOL_SOCKET and option in (SO_ATTACH_FILTER, SO_DETACH_FILTER)
        self.deaf = option == SO_ATTACH_FILTER


def make_service(tmp_path, **server_config) -> tuple[DhcpService, FakeSocket, CollectorRegistry]:
    server = DhcpServer(config(**server_config))
    registry = CollectorRegistry()
    fence = Fence(lambda: 0.0)
    fence.grant(math.inf)
    state = StateStore(tmp_path / "state", fence)
    state.load()  # not running: what is appended waits for a writer the tests never start
    service = DhcpService(
        server,
        LeaseStore(state, server.leases),
        (ON_LINK.interface,),
        DhcpMetrics(registry, server),
        clock=lambda: NOW,
    )
    sock = FakeSocket()
    service.sockets[ON_LINK.interface] = sock
    return service, sock, registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_a_refused_arp_entry_broadcasts_that_reply_and_the_service_goes_on(
    tmp_path, monkeypatch
) -> None:
    service, sock, registry = make_service(tmp_path)
    answers = iter([OSError(errno.ENOBUFS, "No buffer space available"), True])

    def set_arp_entry(sock, interface, address, hwaddr):
        answer = next(answers)
        if isinstance(answer, OSError):
            raise answer
        return answer

    monkeypatch.setattr(shell, "set_arp_entry", set_arp_entry)
    reply = Reply(b"offer", "192.0.2.100", 68, ON_LINK.interface, mac(1), MessageType.OFFER)

    service._send([reply])  # the neighbour table is full: broadcast, no exception
    service._send([reply])  # it has room again: unicast

    assert [address for _, address in sock.sent] == [
        ("255.255.255.255", 68),
        ("192.0.2.100", 68),
    ]
    assert service.l2_unicast  # a passing refusal does not turn unicast off for good
    assert sample(registry, "rackboot_dhcp_l2_fallbacks_total", errno=str(errno.ENOBUFS)) == 1
    assert sample(registry, "rackboot_dhcp_sent_total", type="offer") == 2


def test_without_cap_net_admin_every_reply_is_broadcast(tmp_path, monkeypatch) -> None:
    service, sock, _ = make_service(tmp_path)
    calls = []
    monkeypatch.setattr(shell, "set_arp_entry", lambda *args: calls.append(args) or False)
    reply = Reply(b"offer", "192.0.2.100", 68, ON_LINK.interface, mac(1), MessageType.OFFER)
    service._send([reply])
    service._send([reply])
    assert [address for _, address in sock.sent] == [("255.255.255.255", 68)] * 2
    assert len(calls) == 1 and not service.l2_unicast  # asked once, then never again


async def test_probes_run_one_per_address_and_at_most_max_probes_at_once(
    tmp_path, monkeypatch
) -> None:
    big = subnet(pool=("192.0.2.10", "192.0.2.250"))
    service, sock, registry = make_service(tmp_path, subnets=(big,), probe=True)
    monkeypatch.setattr(shell, "set_arp_entry", lambda *args: True)
    release = trio.Event()
    probed: list[str] = []

    async def icmp_in_use(address: str, timeout: float) -> bool:
        probed.append(address)
        await release.wait()
        return False

    monkeypatch.setattr(shell, "icmp_in_use", icmp_in_use)

    def discover(client: int, xid: int) -> None:
        data = message(MessageType.DISCOVER, mac(client), xid=xid)
        service._dispatch(data, ON_LINK, service.server.handle(data, ON_LINK, NOW))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            service._nursery = nursery
            for xid in range(1, 6):  # one client retransmitting while its probe runs
                discover(1, xid)
            for client in range(2, MAX_PROBES + 12):  # a storm of others
                discover(client, 1)
            await trio.testing.wait_all_tasks_blocked()
            assert len(probed) == len(set(probed)) == MAX_PROBES
            assert sample(registry, "rackboot_dhcp_dropped_total", reason="probe-pending") == 4
            assert sample(registry, "rackboot_dhcp_dropped_total", reason="probe-busy") == 11
            assert not sock.sent
            release.set()

    offers = [parse_untrusted(payload) for payload, _ in sock.sent]
    assert len(offers) == MAX_PROBES
    assert all(o.message_type is MessageType.OFFER for o in offers)
    (first,) = [o for o in offers if o.chaddr[:6] == mac(1)]
    assert first.xid == 5  # the newest of its DISCOVERs was answered
    assert sample(registry, "rackboot_dhcp_probes_total", result="free") == MAX_PROBES
    assert not service._probing
    # A busy client's retransmission gets its probe, then its offer; a probed client's
    # retransmission is answered at once (a clean probe is trusted for a while).
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            service._nursery = nursery
            discover(MAX_PROBES + 11, 2)
            discover(1, 6)
    assert len(probed) == MAX_PROBES + 1
    assert [parse_untrusted(p).xid for p, _ in sock.sent[MAX_PROBES:]] == [6, 2]


def test_replies_of_the_active_leave_from_the_vip_and_a_standbys_from_its_own_address(
    tmp_path, monkeypatch
) -> None:
    """``IP_PKTINFO`` on ``sendmsg`` names the VIP as the source (the server identifier a
    client unicasts its renewals to); a standby, which does not hold it, sends as usual."""
    import socket
    from ipaddress import IPv4Address

    from plugins.dhcp.model import Reservation
    from plugins.dhcp.netio import IP_PKTINFO
    from tests.unit.dhcp.clients import ip

    vip = IPv4Address("192.0.2.5")
    service, sock, _ = make_service(
        tmp_path, vip=vip, reservations=(Reservation(ip("192.0.2.50"), mac(9)),)
    )
    monkeypatch.setattr(shell, "set_arp_entry", lambda *args: True)
    data = message(MessageType.DISCOVER, mac(1))
    service._dispatch(data, ON_LINK, service.server.handle(data, ON_LINK, NOW))
    ((level, kind, pktinfo),) = sock.sources[0]
    assert (level, kind) == (socket.IPPROTO_IP, IP_PKTINFO) and pktinfo[4:8] == vip.packed
    assert parse_untrusted(sock.sent[0][0]).server_id == vip
    service.set_active(False)
    data = message(MessageType.DISCOVER, mac(9))
    service._dispatch(data, ON_LINK, service.server.handle(data, ON_LINK, NOW))
    assert len(sock.sent) == 2 and len(sock.sources) == 1  # sendto: the kernel's choice
    assert parse_untrusted(sock.sent[1][0]).server_id == vip


def test_a_reply_leaves_from_the_interface_while_the_vip_is_not_there_yet(
    tmp_path, monkeypatch
) -> None:
    """Just after the lease is granted the VIP guard may not have added the VIP: the kernel
    refuses it as a source (EINVAL) and the reply goes from the interface's address."""
    from ipaddress import IPv4Address

    service, sock, registry = make_service(tmp_path, vip=IPv4Address("192.0.2.5"))
    monkeypatch.setattr(shell, "set_arp_entry", lambda *args: True)

    def no_such_address(buffers, ancdata, flags, address):
        raise OSError(errno.EINVAL, "Invalid argument")

    sock.sendmsg = no_such_address
    data = message(MessageType.DISCOVER, mac(1))
    service._dispatch(data, ON_LINK, service.server.handle(data, ON_LINK, NOW))
    assert (
        len(sock.sent) == 1 and parse_untrusted(sock.sent[0][0]).message_type is MessageType.OFFER
    )
    assert sample(registry, "rackboot_dhcp_sent_total", type="offer") == 1


def test_a_deaf_socket_drops_what_reaches_it_and_hears_again_when_told() -> None:
    """set_deaf: the kernel drops datagrams while the filter is on (nothing queued, nobody
    woken); after it is lifted the next one arrives. UDP queues in order: had the first
    datagram been kept, it would be read before the second."""
    from plugins.dhcp.netio import set_deaf

    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(5)
        set_deaf(rx, True)
        set_deaf(rx, True)  # again: replaces the filter
        tx.sendto(b"while deaf", rx.getsockname())
        set_deaf(rx, False)
        set_deaf(rx, False)  # no filter left: still fine
        tx.sendto(b"after", rx.getsockname())
        assert rx.recv(100) == b"after"
