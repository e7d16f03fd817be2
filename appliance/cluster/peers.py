"""The site's peer table (sans-IO): who exists, how to reach them, who is up.

Peers come from mDNS (node id known up front), static ``host:port`` entries
(node id learnt on connection) and inbound connections (their hello names
an address we can dial back). Every node dials every peer it knows; a peer
is ``up`` while our session to it lives and ``down`` once it closes or goes
silent. Reconnection waits an exponential, jittered, bounded backoff drawn
from the ``rng`` it is given (seeded in tests). Time is an explicit ``now``
(the shell's monotonic clock); ``wall`` timestamps are only for display.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

UP, DOWN, CONNECTING, REFUSED = "up", "down", "connecting", "refused"


@dataclass
class Peer:
    key: str  # node id, or "static:host:port" until the node id is known
    address: str = ""  # host:port we dial
    node_id: str = ""
    name: str = ""
    rack: str = ""
    role: str = ""
    version: str = ""
    sources: set[str] = field(default_factory=set)  # mdns, static, inbound
    state: str = DOWN
    last_seen: float | None = None  # monotonic
    last_seen_wall: float | None = None
    reason: str = ""  # why it is down or refused
    attempts: int = 0  # failed connections since the last success
    next_attempt: float = 0.0
    inbound: int = 0  # live sessions the peer opened to us
    rtt: float | None = None
    clock_skew: float | None = None  # its wall clock minus ours (session.py), seconds


@dataclass(frozen=True)
class Backoff:
    initial: float = 0.5
    maximum: float = 30.0

    def delay(self, attempts: int, rng: random.Random) -> float:
        """Full-size step ``initial * 2**(attempts-1)`` capped at ``maximum``, jittered to 50-100 %."""
        base = min(self.maximum, self.initial * (2 ** max(0, min(attempts - 1, 30))))
        return base * (0.5 + rng.random() / 2)


class PeerTable:
    def __init__(
        self,
        node_id: str,
        cluster_fp: str,
        *,
        rng: random.Random,
        backoff: Backoff = Backoff(),
        max_peers: int = 256,
    ) -> None:
        self.node_id = node_id
        self.cluster_fp = cluster_fp  # short CA fingerprint announced in mDNS TXT
        self.rng = rng
        self.backoff = backoff
        self.max_peers = max_peers
        self.peers: dict[str, Peer] = {}
        self.ignored_other_cluster = 0

    # -- sources --------------------------------------------------------------

    def add_static(self, address: str) -> None:
        if self._by_address(address) is None:
            self._add(Peer(key=f"static:{address}", address=address, sources={"static"}))

    def discovered(self, node_id: str, cluster_fp: str, address: str, info: dict[str, str]) -> bool:
        """An mDNS announcement; False when it is ignored (ourselves, another cluster, full)."""
        if node_id == self.node_id:
            return False
        if cluster_fp != self.cluster_fp:
            self.ignored_other_cluster += 1
            return False
        peer = self.peers.get(node_id)
        if peer is None:
            static = self._by_address(address)
            if static is not None and not static.node_id:
                peer = self._rekey(static, node_id)
            else:
                peer = self._add(Peer(key=node_id, node_id=node_id))
                if peer is None:
                    return False
        peer.sources.add("mdns")
        if address and peer.state != UP:
            peer.address = address
        for attr in ("name", "rack", "role", "version"):
            if info.get(attr) and not (peer.state == UP and getattr(peer, attr)):
                setattr(peer, attr, info[attr][:64])
        return True

    def withdrawn(self, node_id: str) -> None:
        """mDNS says the service is gone; the entry stays (shown offline) until forgotten."""
        peer = self.peers.get(node_id)
        if peer is not None:
            peer.sources.discard("mdns")

    # -- dialing --------------------------------------------------------------

    def due(self, now: float) -> list[Peer]:
        """Peers to dial now: known address, no session of ours, backoff elapsed."""
        return [
            p
            for p in self.peers.values()
            if p.address and p.state in (DOWN, REFUSED) and now >= p.next_attempt
        ]

    def next_deadline(self) -> float | None:
        waits = [
            p.next_attempt for p in self.peers.values() if p.address and p.state in (DOWN, REFUSED)
        ]
        return min(waits) if waits else None

    def dialing(self, peer: Peer) -> None:
        peer.state = CONNECTING

    def established(
        self, peer: Peer, node_id: str, hello: dict[str, Any], now: float, wall: float
    ) -> Peer:
        """Our session to ``peer`` is up and proved ``node_id``; returns the (re-keyed) entry."""
        if node_id == self.node_id:  # a static entry pointing at ourselves
            self.forget(peer.key)
            return peer
        if peer.key != node_id:
            existing = self.peers.get(node_id)
            if existing is not None and existing is not peer:
                existing.sources |= peer.sources
                existing.address = peer.address or existing.address
                existing.inbound = max(existing.inbound, peer.inbound)
                del self.peers[peer.key]
                peer = existing
            else:
                peer = self._rekey(peer, node_id)
        peer.state = UP
        peer.reason = ""
        peer.attempts = 0
        self._update(peer, hello, now, wall)
        return peer

    def failed(self, peer: Peer, reason: str, now: float, *, refused: bool = False) -> float:
        """Our session ended or could not start; returns when the next attempt is due."""
        peer.attempts += 1
        peer.state = REFUSED if refused else DOWN
        peer.reason = reason
        peer.rtt = peer.clock_skew = None
        peer.next_attempt = now + self.backoff.delay(peer.attempts, self.rng)
        return peer.next_attempt

    def seen(
        self, node_id: str, now: float, wall: float, hello: dict[str, Any] | None = None
    ) -> None:
        """Any authenticated message from ``node_id`` (inbound sessions too)."""
        peer = self.peers.get(node_id)
        if peer is None:
            if node_id == self.node_id:
                return
            addr = (hello or {}).get("addr", "")
            static = self._by_address(addr) if addr else None
            if static is not None and not static.node_id:
                peer = self._rekey(static, node_id)
            else:
                peer = self._add(Peer(key=node_id, node_id=node_id, address=addr))
            if peer is None:
                return
        self._update(peer, hello or {}, now, wall)

    def inbound(self, node_id: str, delta: int) -> None:
        peer = self.peers.get(node_id)
        if peer is not None:
            peer.inbound = max(0, peer.inbound + delta)
            if delta > 0:
                peer.sources.add("inbound")

    def forget(self, key: str) -> None:
        self.peers.pop(key, None)

    # -- views ----------------------------------------------------------------

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        out = []
        for p in sorted(self.peers.values(), key=lambda p: (p.rack, p.name, p.key)):
            out.append(
                {
                    "node_id": p.node_id, "name": p.name, "rack": p.rack, "role": p.role,
                    "address": p.address, "version": p.version, "state": p.state,
                    "health": "online" if p.state == UP else "offline",
                    "last_seen_ago": None if p.last_seen is None else round(now - p.last_seen, 3),
                    "last_seen": p.last_seen_wall, "reason": p.reason,
                    "sources": sorted(p.sources), "rtt_ms": None if p.rtt is None else round(p.rtt * 1000, 3),
                    "clock_skew": None if p.clock_skew is None else round(p.clock_skew, 4),
                }
            )  # fmt: skip
        return out

    def up(self) -> list[Peer]:
        return [p for p in self.peers.values() if p.state == UP]

    # -- internals --------------------------------------------------------------

    def _add(self, peer: Peer) -> Peer | None:
        if len(self.peers) >= self.max_peers:
            return None
        self.peers[peer.key] = peer
        return peer

    def _rekey(self, peer: Peer, node_id: str) -> Peer:
        del self.peers[peer.key]
        peer.key = peer.node_id = node_id
        self.peers[node_id] = peer
        return peer

    def _by_address(self, address: str) -> Peer | None:
        return next((p for p in self.peers.values() if p.address == address), None)

    def _update(self, peer: Peer, hello: dict[str, Any], now: float, wall: float) -> None:
        peer.last_seen, peer.last_seen_wall = now, wall
        for attr in ("name", "rack", "role", "version"):
            if hello.get(attr):
                setattr(peer, attr, str(hello[attr])[:64])
        if hello.get("addr") and (not peer.address or peer.state != UP):
            peer.address = str(hello["addr"])[:300]  # where it listens now (a restart may move it)
