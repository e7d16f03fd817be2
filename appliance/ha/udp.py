"""The election's UDP socket (trio shell): signed datagrams out, verified messages in.

Addresses are ``host:port`` strings: the configured peers and witnesses
(resolved once at start) and, for answers, the source of the request.
Datagrams that fail verification are counted and dropped, and logged once
per sender address and reason so a misconfigured member is named without
flooding the log.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import trio

from appliance.cluster import pki
from appliance.ha.envelope import MAX_DATAGRAM, Opener, seal
from appliance.ha.messages import BadMessage, Message
from appliance.logs import get_logger

log = get_logger("ha")

Deliver = Callable[[str, str, Message], None]


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class UdpTransport:
    def __init__(self, identity, listen: str, port: int) -> None:
        self.identity = identity
        self.key = identity.key
        self.cert_der = pki.cert_der(identity.cert)
        self.opener = Opener(identity.ca, identity.revocations.serials)
        self.listen = (listen, port)
        self.sock: socket.socket | None = None  # non-blocking; sends never wait
        self.port: int | None = None
        self._resolved: dict[str, tuple[str, int]] = {}
        self.counters = {"sent": 0, "received": 0, "refused": 0, "send_errors": 0}
        self._logged: set[tuple[str, str]] = set()

    async def bind(self, addresses: list[str]) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        try:
            sock.bind(self.listen)
        except OSError as exc:
            sock.close()
            raise OSError(
                exc.errno, f"cannot bind the election to {self.listen[0]}:{self.listen[1]}: "
                f"{exc.strerror}",
            ) from None  # fmt: skip
        self.sock = sock
        self.port = sock.getsockname()[1]
        for address in addresses:
            host, port = split(address)
            infos = await trio.socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)
            self._resolved[address] = infos[0][4][:2]

    def send(self, address: str, message: Message) -> None:
        target = self._resolved.get(address) or split(address)
        try:
            self.sock.sendto(seal(message, self.key, self.cert_der), target)
            self.counters["sent"] += 1
        except OSError:  # a full buffer or an unreachable peer: the round will tell
            self.counters["send_errors"] += 1

    async def serve(self, deliver: Deliver) -> None:
        assert self.sock is not None
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            while True:
                try:
                    data, source = self.sock.recvfrom(MAX_DATAGRAM + 1)
                except BlockingIOError:
                    break
                except OSError:  # e.g. an ICMP error queued on the socket
                    continue
                self._open(data, f"{source[0]}:{source[1]}", deliver)

    def _open(self, data: bytes, address: str, deliver: Deliver) -> None:
        try:
            sender, message = self.opener.open_untrusted(data, pki.utc(time.time()))
        except BadMessage as exc:
            self.counters["refused"] += 1
            if (address, str(exc)) not in self._logged and len(self._logged) < 256:
                self._logged.add((address, str(exc)))
                log.warning("refused election datagram", peer=address, reason=str(exc))
            return
        self.counters["received"] += 1
        deliver(sender, address, message)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
