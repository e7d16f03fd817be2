"""The election's UDP socket (trio shell): signed datagrams out, verified messages in.

Addresses are ``host:port`` strings: the configured peers and witnesses
(resolved once at start) and, for answers, the source of the request.
Datagrams that fail verification are counted by reason and dropped, and
logged once per sender address and reason so a misconfigured member is named
without flooding the log. A flood cannot starve the trio thread: a known
certificate costs a hash and a signature check, a refused one a hash (cached),
an unknown one a chain verification only within a per-source and a global
rate, and the receive loop yields to other tasks every :data:`BATCH` datagrams.

Revocation lists travel on the same port (:mod:`appliance.ha.envelope`): each
datagram sealed here states the number of the newest list this node knows,
and the number each address last stated is kept. A newer list goes, as a
datagram of its own, to an address this node is sending to anyway if that
address stated an older one, and, when this node's list changes, to every
configured peer and witness (checked every :data:`CHECK_EVERY`, a renewal). Nothing is sent to a source just because a
datagram came from it, so a replayed or spoofed datagram makes this node send
nothing it would not send anyway; and an address gets a list at most once per
:data:`PUSH_INTERVAL`, all of them at most :data:`PUSH_RATE` a second: the port
is no amplifier. A list learnt from a datagram is in force here at once, and
handed to ``adopt`` (an appliance's cluster service, a witness's disk).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import trio

from appliance import compat
from appliance.cluster import pki
from appliance.ha.envelope import MAX_DATAGRAM, Opened, Opener, seal, seal_crl
from appliance.ha.messages import BadMessage, Message
from appliance.logs import get_logger

log = get_logger("ha")

Deliver = Callable[[str, str, Message], None]
BATCH = 64  # datagrams handled before yielding to the other tasks of the trio thread
REASONS = (
    "malformed", "certificate", "signature", "message", "revocation-list", "rate-limited",
    "incompatible", "internal",
)  # fmt: skip
# Verifications of certificates seen neither good nor bad: per source, and in all.
SOURCE_RATE, SOURCE_BURST = 2.0, 8.0
GLOBAL_RATE, GLOBAL_BURST = 50.0, 100.0
MAX_SOURCES = 1024  # also: addresses whose stated list number is kept
# Revocation lists sent: a list change is offered to the configured members within
# CHECK_EVERY; one list per address per PUSH_INTERVAL, PUSH_RATE a second in all.
CHECK_EVERY = 0.25
PUSH_INTERVAL = 1.0
PUSH_RATE, PUSH_BURST = 16.0, 16.0
Address = tuple[str, int]


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


def _keep_newest(table: dict, key: Any, value: Any) -> None:
    """Set ``table[key]``, re-inserted last so the oldest goes first past MAX_SOURCES."""
    table.pop(key, None)
    if len(table) >= MAX_SOURCES:
        table.pop(next(iter(table)))
    table[key] = value


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class UdpTransport:
    def __init__(
        self,
        identity,
        listen: str,
        port: int,
        revocations: Callable[[], pki.Revocations] | None = None,
        adopt: Callable[[pki.Revocations], Any] | None = None,
        speaks: compat.Speaks = compat.THIS,
    ) -> None:
        """``revocations``: the node's newest revocation list (an appliance's cluster service
        adopts newer ones from its peers), read for every datagram, so a member removed with
        `rackboot cluster remove` is refused from that moment. ``adopt``: called with a newer
        list learnt from a datagram, which is in force here already."""
        self.identity = identity
        self.key = identity.key
        self.cert_der = pki.cert_der(identity.cert)
        self.opener = Opener(identity.ca, identity.revocations)
        self.revocations = revocations or (lambda: identity.revocations)
        self.adopt = adopt or (lambda crl: None)
        # What this node states in every datagram, and what each sender stated (judged:
        # a sender with no election protocol in common is refused, appliance/compat.py).
        self.speaks = speaks
        self._states = (speaks.version, speaks.election.wire())
        self.versions: dict[str, compat.Peer] = {}
        self.dropped = dict.fromkeys(REASONS, 0)
        self._buckets: dict[str, TokenBucket] = {}
        self._global: TokenBucket | None = None
        self.listen = (listen, port)
        self.sock: socket.socket | None = None  # non-blocking; sends never wait
        self.port: int | None = None
        self._resolved: dict[str, Address] = {}
        self.counters = dict.fromkeys(
            ("sent", "received", "refused", "send_errors", "crl_received", "crl_adopted",
             "crl_sent", "crl_limited", "crl_too_large"), 0,
        )  # fmt: skip
        self._logged: set[tuple[str, str]] = set()
        self._stated: dict[Address, int | None] = {}  # address -> the list number it last stated
        self._offered = self.opener.revocations.number  # the newest list offered to the members
        self._pushed: dict[Address, float] = {}  # address -> when it was last sent a list
        self._push_bucket: TokenBucket | None = None
        self._sealed_crl: tuple[int, bytes | None] = (-1, None)
        # node id -> when (trio time) its last datagram passed the certificate, signature and
        # version checks: which acceptors this node hears, authenticated (`rackboot doctor`)
        self._heard: dict[str, float] = {}

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
            self._resolved[address] = (str(infos[0][4][0]), int(infos[0][4][1]))

    def send(self, address: str, message: Message) -> None:
        self._sync()  # the datagram states the node's newest list, offered first if it is news
        target = self._resolved.get(address) or split(address)
        number = self.opener.revocations.number
        if self._behind(target, number):
            self._send_crl(target)  # first: the receiver judges what follows by it
        self._sendto(seal(message, self.key, self.cert_der, number, self._states), target, "sent")

    def _sendto(self, datagram: bytes, target: Address, counter: str) -> None:
        assert self.sock is not None
        try:
            self.sock.sendto(datagram, target)
            self.counters[counter] += 1
        except OSError:  # a full buffer or an unreachable peer: the round will tell
            self.counters["send_errors"] += 1

    async def serve(self, deliver: Deliver) -> None:
        assert self.sock is not None
        while True:
            with trio.move_on_after(CHECK_EVERY):  # a list change is offered even when quiet
                await trio.lowlevel.wait_readable(self.sock)
            self._sync()
            for _ in range(BATCH):
                try:
                    data, source = self.sock.recvfrom(MAX_DATAGRAM + 1)
                except BlockingIOError:
                    break
                except OSError:  # e.g. an ICMP error queued on the socket
                    continue
                sender = self._open(data, source, deliver)
                if sender is not None:  # trio's clock: the node's, as ha status reads it
                    _keep_newest(self._heard, sender, trio.current_time())
            await trio.lowlevel.checkpoint()  # renewals and DHCP share this thread

    def _open(self, data: bytes, source: Address, deliver: Deliver) -> str | None:
        """One datagram through the checks; the sender's node id when it passed them
        (authenticated, a version we speak), else None."""
        address = f"{source[0]}:{source[1]}"
        try:
            self._sync()
            opened = self.opener.open_untrusted(
                data, pki.utc(time.time()), admit=lambda: self._admit(source[0])
            )
        except BadMessage as exc:
            self._refuse(address, exc.kind, str(exc))
            return None
        except Exception as exc:  # a bug of ours at the trust boundary must not stop the node
            self._refuse(address, "internal", f"{type(exc).__name__}: {exc}")
            return None
        self._note(source, opened.crl)
        if opened.message is None:
            self._received_crl(opened, address)
            return opened.sender
        verdict = compat.judge("election", f"node {opened.sender}", opened.version,
                               opened.protocols, self.speaks)  # fmt: skip
        _keep_newest(self.versions, opened.sender, verdict)
        if verdict.problem:
            self._refuse(address, "incompatible", verdict.problem)
            return None
        self.counters["received"] += 1
        deliver(opened.sender, address, opened.message)
        return opened.sender

    # -- revocation lists ------------------------------------------------------------

    def _sync(self) -> None:
        """Adopt the node's newest list; if ours rose, offer it to every configured peer and
        witness at once (whatever they stated: a number is only as fresh as its datagram),
        but those that run a version without revocation lists."""
        self.opener.adopt(self.revocations())
        number = self.opener.revocations.number
        if number > self._offered:
            self._offered = number
            for target in self._resolved.values():
                if target not in self._stated or self._stated[target] is not None:
                    self._send_crl(target)

    def heard(self, now: float) -> dict[str, float]:
        """Seconds since each sender's last authenticated datagram, by node id."""
        return {sender: round(now - at, 3) for sender, at in sorted(self._heard.items())}

    def _note(self, source: Address, stated: int | None) -> None:
        _keep_newest(self._stated, source, stated)

    def _behind(self, target: Address, number: int) -> bool:
        """Did ``target`` last state a list older than ``number``? (Never heard from, or
        stating none, an older version: no.)"""
        stated = self._stated.get(target)
        return stated is not None and stated < number

    def _received_crl(self, opened: Opened, address: str) -> None:
        self.counters["crl_received"] += 1
        crl = opened.adopted
        if crl is None:
            return  # not newer than ours
        self.counters["crl_adopted"] += 1
        log.info(
            "revocation list learnt from an election datagram", number=crl.number,
            revoked=len(crl.serials), node_id=opened.sender, peer=address,
        )  # fmt: skip
        try:
            self.adopt(crl)
        except Exception as exc:  # already in force here; keeping it elsewhere failed
            log.error("revocation list not handed on", number=crl.number, error=repr(exc))
        self._sync()

    def _send_crl(self, target: Address) -> None:
        """Our list to ``target``, at most once per PUSH_INTERVAL per address."""
        now = trio.current_time()
        last = self._pushed.get(target)
        if last is not None and now - last < PUSH_INTERVAL:
            return
        datagram = self._crl_datagram()
        if datagram is None:
            return
        if self._push_bucket is None:
            self._push_bucket = TokenBucket(PUSH_RATE, PUSH_BURST, now)
        if not self._push_bucket.take(now):
            self.counters["crl_limited"] += 1
            return
        self._pushed.pop(target, None)
        if len(self._pushed) >= MAX_SOURCES:
            self._pushed.pop(next(iter(self._pushed)))
        self._pushed[target] = now
        self._sendto(datagram, target, "crl_sent")

    def _crl_datagram(self) -> bytes | None:
        """Our list, sealed once per list; None if there is none or it does not fit."""
        crl = self.opener.revocations
        if self._sealed_crl[0] != crl.number:
            datagram: bytes | None = seal_crl(crl.der, self.key, self.cert_der) if crl.der else None
            if datagram is not None and len(datagram) > MAX_DATAGRAM:
                self.counters["crl_too_large"] += 1
                log.warning(
                    "revocation list too large for an election datagram: witnesses learn it "
                    "only from their crl.der at start", number=crl.number,
                    revoked=len(crl.serials), size=len(datagram), cap=MAX_DATAGRAM,
                )  # fmt: skip
                datagram = None
            self._sealed_crl = (crl.number, datagram)
        return self._sealed_crl[1]

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
