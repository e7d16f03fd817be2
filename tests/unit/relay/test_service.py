"""The relay's reading of its socket (plugins/relay/service.py) on a scripted socket, and
replies as frames through a (scripted) packet socket. When it reads is
tests/trio/test_relay_gather.py's."""

from __future__ import annotations

import errno
import socket
import sys
from ipaddress import IPv4Address

from plugins.dhcp.codec import Message, build
from plugins.dhcp.netio import IP_PKTINFO
from plugins.relay import linklayer, service
from plugins.relay.agent import Link, RelayAgent, RelayConfig
from plugins.relay.service import RelayService

SERVER = int(IPv4Address("10.0.0.2"))
LINK = Link("lo", int(IPv4Address("10.1.1.1")), b"lo")  # lo: an index in any namespace
UPSTREAM_INDEX = 99  # an interface that is not client-facing
CLIENT_MAC = bytes.fromhex("02000000c11e")


def pktinfo(index: int) -> list[tuple[int, int, bytes]]:
    return [(socket.IPPROTO_IP, IP_PKTINFO, index.to_bytes(4, sys.byteorder) + bytes(8))]


def request(xid: int) -> tuple[bytes, list, int, tuple[str, int]]:
    data = build(Message(xid=xid, chaddr=bytes(6), options={53: b"\x01"}))
    return data, pktinfo(socket.if_nametoindex("lo")), 0, ("0.0.0.0", 68)


def reply(xid: int) -> tuple[bytes, list, int, tuple[str, int]]:
    data = build(Message(op=2, xid=xid, flags=0x8000, chaddr=bytes(6),
                         giaddr=IPv4Address("10.1.1.1"), options={53: b"\x02"}))  # fmt: skip
    return data, pktinfo(UPSTREAM_INDEX), 0, ("10.0.0.2", 67)


class ScriptedSocket:
    """recvmsg returns what is queued, then EAGAIN; sends are recorded."""

    def __init__(self) -> None:
        self.queue: list = []
        self.sent: list[tuple[bytes, tuple[str, int]]] = []
        self.delivered: list[tuple[bytes, list, tuple[str, int]]] = []

    def recvmsg(self, size: int, ancsize: int):
        if not self.queue:
            raise BlockingIOError
        return self.queue.pop(0)

    def sendto(self, payload: bytes, destination: tuple[str, int]) -> int:
        self.sent.append((payload, destination))
        return len(payload)

    def sendmsg(self, buffers: list, ancdata: list, flags: int, destination) -> int:
        self.delivered.append((buffers[0], ancdata, destination))
        return len(buffers[0])


def relay_service() -> tuple[RelayService, RelayAgent]:
    agent = RelayAgent(RelayConfig(links=(LINK,), servers=(SERVER,)))
    relay = RelayService(lambda: agent, 67, 68)
    relay._prepare(agent)
    return relay, agent


def test_a_drain_relays_what_has_come_and_says_how_many():
    relay, agent = relay_service()
    sock = ScriptedSocket()
    sock.queue.extend([request(1), reply(1), request(2)])
    assert relay._drain(agent, sock, 256) == 3
    assert [destination for _, destination in sock.sent] == [("10.0.0.2", 67)] * 2
    assert [d[2] for d in sock.delivered] == [("255.255.255.255", 68)]
    assert agent.requests["lo"] == 2 and agent.replies["lo"] == 1 and not agent.dropped
    assert relay._drain(agent, sock, 256) == 0  # an empty socket: nothing to gather


def test_a_drain_stops_at_its_budget_so_that_trio_runs_other_tasks():
    relay, agent = relay_service()
    sock = ScriptedSocket()
    sock.queue.extend(request(xid) for xid in range(15))
    assert relay._drain(agent, sock, 10) == 10 and len(sock.queue) == 5
    assert relay._drain(agent, sock, 10) == 5 and len(sock.sent) == 15


def test_the_server_side_interface_is_looked_up_once(monkeypatch):
    relay, agent = relay_service()
    looked_up: list[int] = []

    def if_indextoname(index: int) -> str:
        looked_up.append(index)
        return "upstream0"

    monkeypatch.setattr(service.socket, "if_indextoname", if_indextoname)
    sock = ScriptedSocket()
    sock.queue.extend([reply(1), reply(2), reply(3)])
    relay._drain(agent, sock, 256)
    assert looked_up == [UPSTREAM_INDEX] and agent.replies["lo"] == 3


class PacketSocket:
    """A packet socket's sendto, recorded; ``refuse``: the errno of the next sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple]] = []
        self.refuse: int | None = None

    def sendto(self, packet: bytes, address: tuple) -> int:
        if self.refuse is not None:
            raise OSError(self.refuse, "refused")
        self.sent.append((packet, address))
        return len(packet)

    def close(self) -> None:
        pass


def framing_service(monkeypatch, kind: int = linklayer.ARPHRD_ETHER):
    """A relay whose "lo" is an Ethernet interface (``kind``) with a packet socket."""
    monkeypatch.setattr(linklayer, "hardware_type", lambda name: kind)
    agent = RelayAgent(RelayConfig(links=(LINK,), servers=(SERVER,)))
    relay = RelayService(lambda: agent, 67, 68)
    packet_socket = PacketSocket()
    relay.frames = linklayer.FrameLinks(packet_socket, 67, 68)
    relay._prepare(agent)
    return relay, agent, packet_socket


def test_a_broadcast_reply_leaves_as_a_frame_through_the_packet_socket(monkeypatch):
    relay, agent, packet_socket = framing_service(monkeypatch)
    sock = ScriptedSocket()
    sock.queue.append(reply(1))
    relay._drain(agent, sock, 256)
    ((packet, address),) = packet_socket.sent
    assert address == ("lo", 0x0800, 0, 0, b"\xff" * 6)  # the kernel adds our MAC
    assert packet[12:20] == IPv4Address("10.1.1.1").packed + b"\xff" * 4
    assert packet[20:24] == (67).to_bytes(2, "big") + (68).to_bytes(2, "big")
    assert agent.replies["lo"] == 1 and sock.delivered == []
    assert relay.frames.uses_frames("lo") and relay.frames.refused == 0
    # the UDP payload is what sendmsg sends without a packet socket
    plain, plain_agent = relay_service()
    sock.queue.append(reply(1))
    plain._drain(plain_agent, sock, 256)
    assert packet[28:] == sock.delivered[0][0]


def test_a_refused_frame_goes_by_sendmsg_and_the_next_one_as_a_frame_again(monkeypatch):
    """Longer than the MTU (EMSGSIZE: sendmsg's datagram is fragmented), the link down,
    the interface gone: this reply by sendmsg, the packet socket kept."""
    relay, agent, packet_socket = framing_service(monkeypatch)
    sock = ScriptedSocket()
    for errno_ in (errno.EMSGSIZE, errno.ENODEV, errno.ENETDOWN):
        packet_socket.refuse = errno_
        sock.queue.append(reply(1))
        relay._drain(agent, sock, 256)
    assert [d[2] for d in sock.delivered] == [("255.255.255.255", 68)] * 3
    assert relay.frames.refused == 3 and packet_socket.sent == []
    packet_socket.refuse = None
    sock.queue.append(reply(2))
    relay._drain(agent, sock, 256)
    assert len(packet_socket.sent) == 1 and len(sock.delivered) == 3


def test_frames_only_on_ethernet_with_a_packet_socket_and_only_broadcasts(monkeypatch):
    relay, agent, packet_socket = framing_service(monkeypatch, kind=772)  # ARPHRD_LOOPBACK
    sock = ScriptedSocket()
    sock.queue.append(reply(1))
    relay._drain(agent, sock, 256)
    assert not relay.frames.uses_frames("lo") and packet_socket.sent == []
    assert len(sock.delivered) == 1
    # no CAP_NET_RAW: no packet socket
    relay, agent, _ = framing_service(monkeypatch)
    relay.frames = linklayer.FrameLinks(None, 67, 68)
    relay._prepare(agent)
    sock.queue.append(reply(2))
    relay._drain(agent, sock, 256)
    assert not relay.frames.uses_frames("lo") and len(sock.delivered) == 2
    # a renewing client (ciaddr set, no broadcast flag) is answered by sendmsg: the
    # kernel resolves its address (it has one)
    relay, agent, packet_socket = framing_service(monkeypatch)
    renew = build(Message(op=2, xid=3, ciaddr=IPv4Address("10.1.1.7"), chaddr=bytes(6),
                          giaddr=IPv4Address("10.1.1.1"), options={53: b"\x05"}))  # fmt: skip
    sock.queue.append((renew, pktinfo(UPSTREAM_INDEX), 0, ("10.0.0.2", 67)))
    relay._drain(agent, sock, 256)
    assert packet_socket.sent == [] and sock.delivered[-1][2] == ("10.1.1.7", 68)


def offer_without_broadcast_flag(xid: int) -> tuple[bytes, list, int, tuple[str, int]]:
    data = build(Message(op=2, xid=xid, yiaddr=IPv4Address("10.1.1.50"), chaddr=CLIENT_MAC,
                         giaddr=IPv4Address("10.1.1.1"), options={53: b"\x02"}))  # fmt: skip
    return data, pktinfo(UPSTREAM_INDEX), 0, ("10.0.0.2", 67)


def test_a_client_without_an_address_gets_a_frame_to_its_mac_and_no_arp_entry(monkeypatch):
    relay, agent, packet_socket = framing_service(monkeypatch)
    entries: list[tuple] = []
    monkeypatch.setattr(service, "set_arp_entry", lambda *a: entries.append(a) or True)
    monkeypatch.setattr(service, "delete_arp_entry", lambda *a: entries.append(a))
    sock = ScriptedSocket()
    sock.queue.append(offer_without_broadcast_flag(1))
    relay._drain(agent, sock, 256)
    ((packet, address),) = packet_socket.sent
    assert address == ("lo", 0x0800, 0, 0, CLIENT_MAC)
    assert packet[16:20] == IPv4Address("10.1.1.50").packed
    assert entries == [] and sock.delivered == []
    # refused (past the MTU, say): an ARP entry and sendmsg to yiaddr, the entry deleted
    packet_socket.refuse = errno.EMSGSIZE
    sock.queue.append(offer_without_broadcast_flag(2))
    relay._drain(agent, sock, 256)
    assert [d[2] for d in sock.delivered] == [("10.1.1.50", 68)]
    assert [e[1:3] for e in entries] == [("lo", "10.1.1.50")] * 2  # set, then deleted
    assert relay.frames.refused == 1
