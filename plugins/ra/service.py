"""The trio shell of the ``ra`` plugin: one raw ICMPv6 socket and one task per interface,
each driving its :class:`~plugins.ra.ndp.Responder` with trio's clock.

Nothing here stops the node: an interface that cannot be served (no such interface,
IPv6 off on it, no CAP_NET_RAW) is logged and shown in status, and the others go on.
An answer is sent from the interface's link-local address; until it has one (DAD
runs for a second or two after the link comes up) the task waits, boundedly."""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass, field
from typing import Any

import trio

from appliance.logs import get_logger

from . import netio
from .ndp import Policy, Responder, Send

log = get_logger("ra")

DRAIN_BATCH = 64
LINK_LOCAL_WAIT = 10.0  # seconds a new link may take to get its link-local address
LINK_LOCAL_POLL = 0.2


@dataclass
class Link:
    name: str
    responder: Responder | None = None
    error: str | None = None  # why it is not served
    sock: socket.socket | None = None
    ifindex: int = 0
    errors: dict[str, int] = field(default_factory=lambda: {"send": 0, "no_link_local": 0})


class RaService:
    def __init__(self, interfaces: tuple[str, ...], policy: Policy) -> None:
        self.policy = policy
        self.links = [Link(name) for name in interfaces]

    async def run(self, node=None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            for link in self.links:
                self._open(link)
            task_status.started()
            async with trio.open_nursery() as nursery:
                for link in self.links:
                    if link.sock is not None:
                        nursery.start_soon(self._serve, link)
        finally:
            for link in self.links:
                if link.sock is not None:
                    link.sock.close()

    def _open(self, link: Link) -> None:
        if netio.is_loopback(link.name):
            link.error = "loopback: no hosts to boot there"
            return
        try:
            link.ifindex = socket.if_nametoindex(link.name)
            link.sock = netio.open_ndp_socket(link.name, link.ifindex)
        except OSError as exc:
            link.error = f"{type(exc).__name__}: {exc.strerror or exc}"
            log.warning("ra not answering", interface=link.name, error=link.error)

    async def _serve(self, link: Link) -> None:
        sock = link.sock
        assert sock is not None
        for _ in range(math.ceil(LINK_LOCAL_WAIT / LINK_LOCAL_POLL)):
            if netio.link_local(link.name) is not None:
                break
            await trio.sleep(LINK_LOCAL_POLL)
        else:
            log.warning("no link-local address yet: answers wait for it", interface=link.name)
        link.responder = responder = Responder(self.policy, netio.hardware_address(link.name))
        self._send(link, responder.start(trio.current_time()))
        log.info("ra started", interface=link.name, mode=self.policy.mode,
                 state=responder.state)  # fmt: skip
        while True:
            deadline = responder.deadline()
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await trio.lowlevel.wait_readable(sock)
                self._drain(link, responder, sock)
                continue
            before = responder.state
            self._send(link, responder.tick(trio.current_time()))
            if responder.state != before:
                log.info("ra state", interface=link.name, state=responder.state)

    def _drain(self, link: Link, responder: Responder, sock: socket.socket) -> None:
        for _ in range(DRAIN_BATCH):
            try:
                data, source, hop_limit = netio.receive(sock)
            except BlockingIOError:
                return
            except OSError as exc:
                log.debug("receive error", interface=link.name, error=str(exc))
                continue
            before = responder.state
            self._send(link, responder.receive(data, source, hop_limit, trio.current_time()))
            if responder.state != before:
                log.info("ra state", interface=link.name, state=responder.state,
                         router=responder.status(0.0)["router"])  # fmt: skip

    def _send(self, link: Link, sends: list[Send]) -> None:
        if not sends:
            return
        source = netio.link_local(link.name)
        if source is None:
            link.errors["no_link_local"] += len(sends)
            return
        assert link.sock is not None
        for item in sends:
            try:
                netio.send(link.sock, item.payload, item.destination, link.ifindex, source)
            except OSError as exc:  # a full buffer, the link going down: the host asks again
                link.errors["send"] += 1
                log.debug("ra not sent", interface=link.name, error=str(exc))

    def status(self) -> dict[str, Any]:
        now = trio.current_time()
        out: dict[str, Any] = {}
        for link in self.links:
            if link.error is not None:
                out[link.name] = {"state": "off", "reason": link.error}
            elif link.responder is None:
                out[link.name] = {"state": "starting"}
            else:
                out[link.name] = {**link.responder.status(now), "send_errors": dict(link.errors)}
        return out
