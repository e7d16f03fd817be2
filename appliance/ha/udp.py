"""The election's UDP socket (trio shell): signed datagrams out, verified messages in.

Addresses are ``host:port`` strings: the configured peers and witnesses
(resolved once at start) and, for answers, the source of the request.
Datagrams that fail verification are counted by reason and dropped, and
logged once per sender address and reason so a misconfigured member is named
without flooding the log. A flood cannot starve the trio thread: a known
certificate costs a hash and a signature check, a refused one a hash (cached),
an unknown one a chain verification only within a per-source and a global
rate, and the receive loop yields to other tasks every :data:`BATCH` datagrams.
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
BATCH = 64  # datagrams handled before yielding to the other tasks of the trio thread
REASONS = ("malformed", "certificate", "signature", "message", "rate-limited", "internal")
# Verifications of certificates seen neither good nor bad: per source, and in all.
SOURCE_RATE, SOURCE_BURST = 2.0, 8.0
GLOBAL_RATE, GLOBAL_BURST = 50.0, 100.0
MAX_SOURCES = 1024


class TokenBucket:
    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class UdpTransport:
    def __init__(
        self, identity, listen: str, port: int, revoked: Callable[[], frozenset[int]] | None = None
    ) -> None:
        """``revoked``: the newest revocation list's serials, read for every datagram, so a
        member removed with `rackboot cluster remove` is refused from that moment."""
        self.identity = identity
        self.key = identity.key
        self.cert_der = pki.cert_der(identity.cert)
        self.opener = Opener(identity.ca, identity.revocations.serials)
        self.revoked = revoked or (lambda: identity.revocations.serials)
        self.dropped = dict.fromkeys(REASONS, 0)
        self._buckets: dict[str, TokenBucket] = {}
        self._global: TokenBucket | None = None
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
            for _ in range(BATCH):
                try:
                    data, source = self.sock.recvfrom(MAX_DATAGRAM + 1)
                except BlockingIOError:
                    break
                except OSError:  # e.g. an ICMP error queued on the socket
                    continue
                self._open(data, source, deliver)
            await trio.lowlevel.checkpoint()  # renewals and DHCP share this thread

    def _open(self, data: bytes, source: tuple[str, int], deliver: Deliver) -> None:
        address = f"{source[0]}:{source[1]}"
        try:
            self.opener.set_revoked(self.revoked())
            sender, message = self.opener.open_untrusted(
                data, pki.utc(time.time()), admit=lambda: self._admit(source[0])
            )
        except BadMessage as exc:
            self._refuse(address, exc.kind, str(exc))
            return
        except Exception as exc:  # a bug of ours at the trust boundary must not stop the node
            self._refuse(address, "internal", f"{type(exc).__name__}: {exc}")
            return
        self.counters["received"] += 1
        deliver(sender, address, message)

    def _refuse(self, address: str, kind: str, why: str) -> None:
        self.counters["refused"] += 1
        self.dropped[kind] = self.dropped.get(kind, 0) + 1
        if (address, why) not in self._logged and len(self._logged) < 256:
            self._logged.add((address, why))
            log.warning("refused election datagram", peer=address, reason=why, kind=kind)

    def _admit(self, host: str) -> bool:
        """May an unknown certificate from ``host`` be verified now?"""
        now = trio.current_time()
        if self._global is None:
            self._global = TokenBucket(GLOBAL_RATE, GLOBAL_BURST, now)
        bucket = self._buckets.get(host)
        if bucket is None:
            if len(self._buckets) >= MAX_SOURCES:
                self._buckets.pop(next(iter(self._buckets)))
            bucket = self._buckets[host] = TokenBucket(SOURCE_RATE, SOURCE_BURST, now)
        return bucket.take(now) and self._global.take(now)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
