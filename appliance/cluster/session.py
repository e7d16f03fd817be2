"""The peer protocol over one authenticated connection (sans-IO, aioquic-shaped).

Both ends send ``hello`` first: cluster protocol range, software version,
node id, name, rack, role, advertised address, revocation-list number. The
versions are then decided by :func:`negotiate`; an incompatible peer is sent
``refuse`` with a reason naming both versions and the session closes. After
that, each end pings every ``keepalive`` seconds and closes a session that
has been silent for ``dead_after`` seconds.

A pong carries the answering end's wall-clock time (``w``), so the pinging end
measures the peer's clock skew as an NTP client would: that time against the
midpoint of the round trip on its own wall clock (``rackboot doctor`` reports
it). An older peer's pong lacks ``w`` (extra fields are ignored both ways):
no skew then. Time comes in as ``now`` (the shell's monotonic clock) and,
for this, ``wall`` (its wall clock); a caller that passes no ``wall`` gets no
skew.

From cluster protocol 2 on, either end may send a **request** (``call``: an id, a
command name, arguments) that the other answers with ``reply`` (ok and a result,
or an error text): the rolling update's requests between appliances
(appliance/rolling). A session on protocol 1 sends none (an older peer would close
the link on an unknown message type) and refuses any it receives.

The shell feeds bytes with :meth:`Session.receive_data`, sends
:meth:`Session.data_to_send`, arms :meth:`Session.get_timer` and calls
:meth:`Session.handle_timer`, and reads :meth:`Session.next_event`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from appliance import compat
from appliance.cluster import wire

PROTO_MIN = compat.THIS.cluster.lo
PROTO_MAX = compat.THIS.cluster.hi
CALLS_FROM = 2  # the first cluster protocol with requests between nodes
# A skew sample is kept only when the wall clock moved as the monotonic one did during
# its round trip (within this many seconds): a clock stepped mid-ping measures nothing.
WALL_STEP_TOLERANCE = 0.5


@dataclass(frozen=True)
class LocalInfo:
    cluster_id: str
    node_id: str
    name: str
    rack: str
    role: str
    version: str
    addr: str  # "host:port" peers can dial back, or ""
    crl: int = 0
    proto_min: int = PROTO_MIN
    proto_max: int = PROTO_MAX


@dataclass(frozen=True)
class PeerHello:
    node_id: str
    name: str
    rack: str
    role: str
    version: str
    addr: str
    crl: int
    proto_min: int
    proto_max: int


# -- events -------------------------------------------------------------------


@dataclass(frozen=True)
class Established:
    peer: PeerHello
    proto: int


@dataclass(frozen=True)
class RoleChanged:
    role: str


@dataclass(frozen=True)
class CrlReceived:
    der: bytes


@dataclass(frozen=True)
class Closed:
    reason: str
    refused: bool = False  # we refused the peer (version, identity)
    refused_by_peer: bool = False
    garbage: bool = False  # undecodable or oversized bytes


@dataclass(frozen=True)
class CallReceived:
    """The peer asks us to run ``cmd``; the shell answers with :meth:`Session.reply`."""

    id: int
    cmd: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Replied:
    """The peer's answer to our request ``id``."""

    id: int
    ok: bool
    result: Any
    error: str


Event = Established | RoleChanged | CrlReceived | Closed | CallReceived | Replied


def negotiate(our_min: int, our_max: int, their_min: int, their_max: int) -> int | None:
    """The highest protocol both speak, or None."""
    return compat.Range(our_min, our_max).common(compat.Range(their_min, their_max))


def describe(version: str, lo: int, hi: int) -> str:
    return compat.describe(version, "cluster", compat.Range(lo, hi))


class Session:
    def __init__(
        self,
        local: LocalInfo,
        now: float,
        *,
        expected_node: str | None,
        keepalive: float = 1.0,
        dead_after: float = 3.0,
        max_message: int = wire.DEFAULT_MAX_MESSAGE,
    ) -> None:
        """``expected_node``: the node id the peer's certificate proves (None: any)."""
        self.local = local
        self.expected_node = expected_node
        self.keepalive = keepalive
        self.dead_after = dead_after
        self.reader = wire.FrameReader(max_message)
        self.peer: PeerHello | None = None
        self.proto: int | None = None
        self.closed: Closed | None = None
        self.last_rx = now
        self.next_ping = now + keepalive
        self.pings = 0
        self.rtt: float | None = None
        self.clock_skew: float | None = None  # the peer's wall clock minus ours, last sample
        self._ping_sent: dict[int, tuple[float, float | None]] = {}
        self._out = bytearray()
        self._events: deque[Event] = deque()
        self._send(
            {
                "t": "hello", "proto_min": local.proto_min, "proto_max": local.proto_max,
                "version": local.version, "cluster": local.cluster_id, "node": local.node_id,
                "name": local.name, "rack": local.rack, "role": local.role,
                "addr": local.addr, "crl": local.crl,
            }
        )  # fmt: skip

    @property
    def established(self) -> bool:
        return self.peer is not None and self.closed is None

    # -- shell interface ------------------------------------------------------

    def receive_data(self, data: bytes, now: float, wall: float | None = None) -> None:
        if self.closed is not None:
            return
        if not data:
            self._close(Closed("peer closed the connection"))
            return
        try:
            messages = self.reader.feed(data)
        except wire.FrameError as exc:
            self._close(Closed(f"refused bytes from peer: {exc}", garbage=True))
            return
        for message in messages:
            self.last_rx = now
            self._handle(message, now, wall)
            if self.closed is not None:
                break

    def data_to_send(self) -> bytes:
        data = bytes(self._out)
        self._out.clear()
        return data

    def get_timer(self) -> float | None:
        if self.closed is not None:
            return None
        deadline = self.last_rx + self.dead_after
        return min(deadline, self.next_ping) if self.established else deadline

    def handle_timer(self, now: float, wall: float | None = None) -> None:
        if self.closed is not None:
            return
        if now >= self.last_rx + self.dead_after:
            what = "keepalive" if self.established else "hello"
            self._close(Closed(f"no {what} from peer for {self.dead_after:g} s"))
            return
        if self.established and now >= self.next_ping:
            self.pings += 1
            self._ping_sent = {self.pings: (now, wall)}  # only the newest ping measures
            self._send({"t": "ping", "n": self.pings, "role": self.local.role})
            self.next_ping = now + self.keepalive

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    # -- what the shell may send ------------------------------------------------

    def set_role(self, role: str) -> None:
        """Our role changed; peers learn it with the next ping."""
        self.local = LocalInfo(**{**self.local.__dict__, "role": role})

    def send_crl(self, der: bytes) -> None:
        if self.established:
            self._send({"t": "crl", "der": der})

    def close(self, reason: str) -> None:
        self._close(Closed(reason))

    def call(self, id: int, cmd: str, args: dict[str, Any]) -> None:
        """A request to the peer; ValueError (naming the peer's version) when this session
        cannot carry one."""
        if not self.established:
            raise ValueError("the link is not established")
        if (self.proto or 0) < CALLS_FROM:
            peer = self.peer
            assert peer is not None
            runs = describe(peer.version, peer.proto_min, peer.proto_max)
            raise ValueError(f"{peer.node_id} runs {runs}, which takes no requests between "
                             f"appliances (cluster protocol {CALLS_FROM} on): update it")  # fmt: skip
        self._send({"t": "call", "id": id, "cmd": cmd, "args": args})

    def reply(self, id: int, ok: bool, result: Any = None, error: str = "") -> None:
        if self.established:
            self._send({"t": "reply", "id": id, "ok": ok, "result": result, "error": error})

    # -- internals --------------------------------------------------------------

    def _send(self, message: dict) -> None:
        self._out += wire.encode(message)

    def _close(self, event: Closed) -> None:
        if self.closed is None:
            self.closed = event
            self._events.append(event)

    def _refuse(self, reason: str) -> None:
        self._send({"t": "refuse", "reason": reason})
        self._close(Closed(reason, refused=True))

    def _handle(self, message: dict, now: float, wall: float | None) -> None:
        kind = message["t"]
        if kind == "refuse":
            self._close(Closed(f"peer refused us: {message['reason'][:300]}", refused_by_peer=True))
        elif self.peer is None:
            if kind != "hello":
                self._refuse(f"expected hello, got {kind}")
            else:
                self._hello(message)
        elif kind == "ping":
            self._send({"t": "pong", "n": message["n"]} | ({} if wall is None else {"w": wall}))
            if message["role"] != self.peer.role:
                self.peer = PeerHello(**{**self.peer.__dict__, "role": message["role"][:32]})
                self._events.append(RoleChanged(self.peer.role))
        elif kind == "pong":
            sent = self._ping_sent.pop(message["n"], None)
            if sent is not None:
                self.rtt = now - sent[0]
                self._measure_skew(sent[1], wall, message.get("w"))
        elif kind == "crl":
            self._events.append(CrlReceived(message["der"]))
        elif kind in ("call", "reply") and (self.proto or 0) >= CALLS_FROM:
            self._events.append(
                CallReceived(message["id"], message["cmd"][:64], message["args"])
                if kind == "call"
                else Replied(
                    message["id"], message["ok"], message["result"], message["error"][:500]
                )
            )
        else:
            self._refuse(f"unexpected {kind} message after hello")

    def _measure_skew(self, sent: float | None, received: float | None, theirs: object) -> None:
        """``theirs`` is untrusted: a finite number, or no sample."""
        if sent is None or received is None or self.rtt is None:
            return
        if not isinstance(theirs, int | float) or isinstance(theirs, bool):
            return
        if not math.isfinite(theirs) or abs(received - sent - self.rtt) > WALL_STEP_TOLERANCE:
            return
        self.clock_skew = theirs - (sent + received) / 2

    def _hello(self, m: dict) -> None:
        local = self.local
        if m["cluster"] != local.cluster_id:
            return self._refuse(
                f"peer says cluster {m['cluster'][:32]!r}, we are {local.cluster_id}"
            )
        if self.expected_node is not None and m["node"] != self.expected_node:
            return self._refuse(
                f"hello names node {m['node'][:32]!r} but the certificate proves {self.expected_node}"
            )
        if m["node"] == local.node_id:
            return self._refuse("connected to ourselves")
        proto = negotiate(local.proto_min, local.proto_max, m["proto_min"], m["proto_max"])
        if proto is None:
            return self._refuse(compat.refusal(
                "cluster", f"node {m['node'][:32]}",
                (m["version"][:64], compat.Range(m["proto_min"], m["proto_max"])),
                (local.version, compat.Range(local.proto_min, local.proto_max)),
            ))  # fmt: skip
        self.proto = proto
        self.peer = PeerHello(
            node_id=m["node"], name=m["name"][:64], rack=m["rack"][:64], role=m["role"][:32],
            version=m["version"][:64], addr=m["addr"][:300], crl=m["crl"],
            proto_min=m["proto_min"], proto_max=m["proto_max"],
        )  # fmt: skip
        self._events.append(Established(self.peer, proto))
