"""The ``ra`` plugin's shell (plugins/ra/service.py) on trio's autojump clock: the
raw socket is replaced by a Unix datagram pair whose datagrams carry their IPv6
source in front, so the loop's timing (listening, answering, falling quiet,
probing again) runs without root or real time. The real socket: tests/real/test_ra.py."""

from __future__ import annotations

import socket

import pytest
import trio

from plugins.ra import netio, service
from plugins.ra.ndp import ALL_ROUTERS, RA, RS, Policy, build_advertisement, build_solicitation
from plugins.ra.service import RaService

MAC = bytes.fromhex("525400aabbcc")
OURS = bytes.fromhex("fe80000000000000505400fffeaabbcc")
HOST = bytes.fromhex("fe80000000000000505400fffe6e6201")
ROUTER = bytes.fromhex("fe800000000000000000000000000001")
RS_FROM_HOST = HOST + bytes((RS, 0)) + bytes(6)
RA_FROM_ROUTER = ROUTER + bytes((RA, 0, 0, 0, 64, 0, 7, 8)) + bytes(8)  # lifetime 1800


class FakeLinks:
    """netio, with one socketpair per interface; ``sent``: (interface, payload, to)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, refuse: tuple[str, ...] = ()) -> None:
        self.peers: dict[str, socket.socket] = {}
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.refuse = refuse
        names = {1: "eth1", 2: "eth2", 3: "lo"}
        monkeypatch.setattr(service.socket, "if_nametoindex",
                            lambda name: {v: k for k, v in names.items()}[name])  # fmt: skip
        monkeypatch.setattr(netio, "open_ndp_socket", self.open)
        monkeypatch.setattr(netio, "receive", lambda sock: self.receive(sock))
        monkeypatch.setattr(netio, "send", lambda sock, payload, to, ifindex, source:
                            self.sent.append((names[ifindex], payload, to)))  # fmt: skip
        monkeypatch.setattr(netio, "link_local", lambda name: OURS)
        monkeypatch.setattr(netio, "hardware_address", lambda name: MAC)
        monkeypatch.setattr(netio, "is_loopback", lambda name: name == "lo")

    def open(self, interface: str, ifindex: int) -> socket.socket:
        if interface in self.refuse:
            raise PermissionError(1, "Operation not permitted")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        ours.setblocking(False)
        self.peers[interface] = theirs
        return ours

    @staticmethod
    def receive(sock: socket.socket) -> tuple[bytes, bytes, int | None]:
        data = sock.recv(2048)
        return data[16:], data[:16], 255

    def hear(self, interface: str, datagram: bytes) -> None:
        self.peers[interface].send(datagram)

    def close(self) -> None:
        for peer in self.peers.values():
            peer.close()


async def test_auto_listens_answers_falls_quiet_and_probes_again(monkeypatch, autojump_clock):
    links = FakeLinks(monkeypatch)
    ra = RaService(("eth1",), Policy("auto", listen=2.0, hold=100.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(ra.run)
        await trio.sleep(0.1)
        assert links.sent == [("eth1", build_solicitation(MAC), ALL_ROUTERS)]
        assert ra.status()["eth1"]["state"] == "probing"
        links.hear("eth1", RS_FROM_HOST)
        await trio.sleep(1.0)
        assert len(links.sent) == 1  # still listening: not answered
        await trio.sleep(1.0)  # the listening deadline passes without a datagram
        assert ra.status()["eth1"]["state"] == "answering"
        links.hear("eth1", RS_FROM_HOST)
        await trio.sleep(0.1)
        assert links.sent[-1] == ("eth1", build_advertisement(MAC), HOST)
        links.hear("eth1", RA_FROM_ROUTER)
        await trio.sleep(0.1)
        status = ra.status()["eth1"]
        assert (status["state"], status["router"]) == ("quiet", "fe80::1")
        links.hear("eth1", RS_FROM_HOST)
        await trio.sleep(50.0)
        assert len(links.sent) == 2
        await trio.sleep(51.0)  # the router silent for hold: solicit and listen again
        assert links.sent[-1] == ("eth1", build_solicitation(MAC), ALL_ROUTERS)
        assert ra.status()["eth1"]["state"] == "probing"
        nursery.cancel_scope.cancel()
    links.close()


async def test_an_interface_it_cannot_serve_stops_nothing(monkeypatch, autojump_clock):
    links = FakeLinks(monkeypatch, refuse=("eth2",))
    ra = RaService(("lo", "eth2", "eth1"), Policy("always"))
    async with trio.open_nursery() as nursery:
        await nursery.start(ra.run)
        await trio.sleep(0.1)
        status = ra.status()
        assert status["lo"] == {"state": "off", "reason": "loopback: no hosts to boot there"}
        assert status["eth2"]["state"] == "off" and "PermissionError" in status["eth2"]["reason"]
        assert status["eth1"]["state"] == "answering"
        links.hear("eth1", RS_FROM_HOST)
        await trio.sleep(0.1)
        assert links.sent == [("eth1", build_advertisement(MAC), HOST)]
        nursery.cancel_scope.cancel()
    links.close()
