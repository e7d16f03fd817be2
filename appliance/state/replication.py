"""The replication stream between the rack's active appliance and a standby (sans-IO).

One stream per standby, over a mutually authenticated TLS link; every message
is a signed frame (appliance/state/signing.py). The standby (follower) dials
the active (leader):

1. follower: ``["hello", epoch, lsn]``: the epoch and LSN of its last record;
2. leader: ``["end", epoch, lsn]``: the newest epoch it knows that is not newer
   than the follower's, and where that epoch ends in its log (``lsn`` -1: it
   cannot tell, the follower's epoch is older than its history);
3. follower: cuts its log after the last record both logs share (the end the
   leader named, or the end of that epoch in its own log if the leader never
   wrote the follower's epoch: Kafka's KIP-279 rule), and says
   ``["from", epoch, lsn]``: its last record after the cut (:meth:`FollowerStream.resume`);
4. leader: a snapshot if it no longer keeps the records after that
   (``["snapshot", epoch, head, entries, done]`` chunks, then the records
   after it), else the records after it: ``["records", epoch, [record, ...]]``,
   consecutive, as soon as they are appended (before they commit, as Raft
   does); the follower writes them, fsyncs, and says ``["ack", lsn]``.

Wall clocks: leases expire by wall-clock time, so the leader pings every
stream now and then (``["ping", epoch, its wall time]``), the follower
answers ``["pong", that time, its own]``, and the leader estimates the
follower's clock skew as an NTP client would (its reading against the
midpoint of the round trip): a standby whose clock is too far off is declared
ineligible like one that lags.

``epoch`` in the leader's frames is its lease's epoch. A follower refuses a
frame of an epoch lower than the highest it has seen (and than its own
election's): a deposed active can no longer get a record accepted. It
refuses records that do not continue its log exactly (a replay, a gap), and
anything out of turn; the shell counts the refusal and drops the link, and
the follower starts over with a hello.

The records that never reached a follower before its leader was deposed are
its **divergent tail**: never acknowledged by the new leader's quorum, they
are what step 3 cuts.

Versions (appliance/compat.py). From replication protocol 2 on, the hello
carries a fourth element ``{"v": software version, "p": [lo, hi] replication
protocols, "f": [lo, hi] state log formats it reads}`` and the leader's end
answers with ``{"v", "p", "w": the log format it writes}``; a peer of protocol 1
states nothing (three elements) and is taken to speak protocol 1 and format 1.
A leader refuses a follower with no protocol in common or that cannot read the
format it writes: it sends ``["refuse", text]`` naming both versions and ends
the link, and sends no record, so an older appliance never misreads a newer
log; a follower refuses such a leader the same way. Both show the text in
status and count it (``incompatible``, ``refused-by-leader``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from appliance import compat
from appliance.state.records import (
    BadEntry,
    EpochHistory,
    Record,
    SnapshotEntry,
    SnapshotHead,
    decode_untrusted,
    encode,
)
from appliance.state.signing import Refused

MAX_BATCH_RECORDS = 512
MAX_BATCH_BYTES = 256 * 1024
SNAPSHOT_CHUNK = 2048  # entries per snapshot frame
MAX_UNACKED = 8192  # records sent and not acknowledged before the leader waits
MAX_PING_RTT = 10.0  # s: a pong later than this tells nothing about the clocks


def _uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# -- the follower ------------------------------------------------------------------


@dataclass(frozen=True)
class Truncate:
    """Cut the log after ``lsn`` (the divergent tail)."""

    lsn: int


@dataclass(frozen=True)
class Install:
    """Replace the state with this snapshot."""

    head: SnapshotHead
    entries: list[SnapshotEntry]


@dataclass(frozen=True)
class Append:
    records: list[Record]


Action = Truncate | Install | Append


def _stated(speaks: compat.Speaks, **more: Any) -> dict[str, Any]:
    return {"v": speaks.version, "p": speaks.replication.wire(), **more}


def _judge(peer: str, stated: Any, ours: compat.Speaks) -> compat.Peer:
    """What a hello or end's fourth element says (None: a peer of protocol 1)."""
    info = stated if isinstance(stated, dict) else {}
    return compat.judge("replication", peer, info.get("v"), info.get("p"), ours)


class FollowerStream:
    """A standby's end of one stream. The shell writes what the actions say, in order,
    and calls :meth:`durable` once an ``Append`` is on disk."""

    def __init__(self, last: tuple[int, int], history: EpochHistory, known_epoch: int,
                 speaks: compat.Speaks = compat.THIS, leader: str = "the leader") -> None:  # fmt: skip
        self.last_epoch, self.last_lsn = last
        self.history = history
        self.highest_epoch = max(known_epoch, last[0])
        self.stage = "hello"
        self._snapshot: tuple[SnapshotHead, list[SnapshotEntry]] | None = None
        self.speaks, self.leader = speaks, leader
        self.peer: compat.Peer | None = None  # what the leader stated

    def hello(self) -> list[Any]:
        self.stage = "end"
        stated = _stated(self.speaks, f=self.speaks.log.wire())
        return ["hello", self.last_epoch, self.last_lsn, stated]

    def receive(self, message: Any, wall: float = 0.0) -> tuple[list[Action], list[Any] | None]:
        """Actions for the shell, and a message to send back (or None). ``wall``: this
        node's wall-clock time, for the answer to a ping."""
        if not isinstance(message, list) or not message or not isinstance(message[0], str):
            raise Refused("malformed", "not a replication message")
        kind = message[0]
        if kind == "refuse" and len(message) == 2 and isinstance(message[1], str):
            raise Refused("refused-by-leader", message[1][:500])
        if kind == "end" and self.stage == "end":
            return self._end(message)
        if kind == "ping" and self.stage in ("stream", "snapshot", "cut"):
            self._epoch(message)
            if len(message) != 3 or not isinstance(message[2], float):
                raise Refused("malformed", "ping")
            return [], ["pong", message[2], wall]
        if kind in ("snapshot", "records") and self.stage in ("stream", "snapshot"):
            self._epoch(message)
            chunk = self._snapshot_chunk if kind == "snapshot" else self._records
            return chunk(message), None
        raise Refused("unexpected", f"{kind!r} while waiting for {self.stage}")

    def durable(self, lsn: int) -> list[Any]:
        return ["ack", lsn]

    def saw_epoch(self, epoch: int) -> None:
        """The election has seen ``epoch``: frames of a lower one are refused from now on."""
        self.highest_epoch = max(self.highest_epoch, epoch)

    def _epoch(self, message: list[Any]) -> None:
        if len(message) < 2 or not _uint(message[1]):
            raise Refused("malformed", "no epoch")
        if message[1] < self.highest_epoch:
            raise Refused("old-epoch", f"epoch {message[1]} < {self.highest_epoch}")
        self.highest_epoch = message[1]

    def resume(self, epoch: int, lsn: int) -> list[Any]:
        """After the cut (if any) the shell made: where this log really ends now (a cut
        below the local snapshot leaves nothing, and the leader sends a snapshot)."""
        if self.stage != "cut":
            raise Refused("unexpected", "resume before the leader named its end")
        self.last_epoch, self.last_lsn, self.stage = epoch, lsn, "stream"
        return ["from", epoch, lsn]

    def _end(self, message: list[Any]) -> tuple[list[Action], None]:
        if len(message) not in (3, 4) or not _uint(message[1]) or not isinstance(message[2], int):
            raise Refused("malformed", "end")
        stated = message[3] if len(message) == 4 else None
        self.peer = _judge(self.leader, stated, self.speaks)
        writes = stated.get("w", 1) if isinstance(stated, dict) else 1
        if self.peer.problem:
            raise Refused("incompatible", self.peer.problem)
        if writes not in self.speaks.log:
            raise Refused("incompatible", compat.refusal(
                "log", self.leader, (self.peer.version, writes),
                (self.speaks.version, self.speaks.log),
            ))  # fmt: skip
        epoch, end = message[1], message[2]
        if end < 0:  # the leader cannot tell: start from nothing, a snapshot follows
            cut = 0
        elif epoch == self.last_epoch:
            cut = min(self.last_lsn, end)
        else:
            mine = self.history.end_of(epoch, self.last_lsn)
            cut = min(end, mine if mine is not None else 0)
        self.stage = "cut"
        return ([Truncate(cut)] if cut < self.last_lsn else []), None

    def _snapshot_chunk(self, message: list[Any]) -> list[Action]:
        if len(message) != 5 or not isinstance(message[3], list) or message[4] not in (0, 1):
            raise Refused("malformed", "snapshot")
        _, _, head_bytes, chunk, done = message
        try:
            if self._snapshot is None:
                head = decode_untrusted(head_bytes) if isinstance(head_bytes, bytes) else None
                if not isinstance(head, SnapshotHead):
                    raise Refused("malformed", "snapshot without a head")
                self._snapshot = (head, [])
            entries = [decode_untrusted(e) if isinstance(e, bytes) else None for e in chunk]
        except BadEntry as exc:
            raise Refused("malformed", str(exc)) from None
        if not all(isinstance(e, SnapshotEntry) for e in entries):
            raise Refused("malformed", "not a snapshot entry")
        head, got = self._snapshot
        got.extend(entries)  # type: ignore[arg-type]
        self.stage = "snapshot"
        if not done:
            return []
        self._snapshot = None
        if len(got) != head.entries:
            raise Refused("malformed", f"snapshot of {len(got)} entries, head says {head.entries}")
        self.last_epoch, self.last_lsn, self.stage = head.epoch, head.lsn, "stream"
        self.history = EpochHistory(head.history)
        return [Install(head, got)]

    def _records(self, message: list[Any]) -> list[Action]:
        if self.stage != "stream" or len(message) != 3 or not isinstance(message[2], list):
            raise Refused("malformed" if self.stage == "stream" else "unexpected", "records")
        try:
            records = [decode_untrusted(r) if isinstance(r, bytes) else None for r in message[2]]
        except BadEntry as exc:
            raise Refused("malformed", str(exc)) from None
        out: list[Record] = []
        for record in records:
            if not isinstance(record, Record):
                raise Refused("malformed", "not a record")
            if record.lsn <= self.last_lsn:
                raise Refused("replay", f"record {record.lsn}, have {self.last_lsn}")
            if record.lsn != self.last_lsn + 1:
                raise Refused("gap", f"record {record.lsn} after {self.last_lsn}")
            if record.epoch < self.last_epoch or record.epoch > message[1]:
                raise Refused("old-epoch", f"record of epoch {record.epoch}")
            self.history.note(record.epoch, record.lsn)
            self.last_epoch, self.last_lsn = record.epoch, record.lsn
            out.append(record)
        return [Append(out)] if out else []


# -- the leader ----------------------------------------------------------------------


class Source(Protocol):
    """What a leader's streams read: the store (appliance/state/store.py) implements it."""

    base: int  # records at or below this are only in the snapshot

    def last(self) -> int:
        """The last record appended (written to disk or not)."""
        ...

    def records(self, after: int, limit: int) -> Sequence[Record]:
        """Up to ``limit`` records after LSN ``after`` (which is at least ``base``)."""
        ...

    def snapshot(self) -> tuple[SnapshotHead, list[SnapshotEntry]]:
        """The committed state; :meth:`records` continues after it."""
        ...

    def end_of(self, epoch: int) -> tuple[int, int]:
        """The newest epoch not newer than ``epoch`` and its last LSN; (epoch, -1)
        when the log's history does not reach back that far."""
        ...

    def epoch_at(self, lsn: int) -> int | None:
        """The epoch of record ``lsn`` if the log still has it (or it is the snapshot's)."""
        ...


@dataclass
class LeaderStream:
    """The active's end of one follower's stream."""

    source: Source
    epoch: int  # this leader's lease epoch
    speaks: compat.Speaks = compat.THIS
    follower: str = "the standby"
    peer: compat.Peer | None = None  # what the follower stated
    refused: str = ""  # why it was refused (sent to it as ["refuse", text]); the shell ends
    stage: str = "hello"  # hello -> from -> (snapshot ->) stream
    sent: int = 0  # the last LSN sent
    acked: int = 0  # the last LSN the follower has on disk
    skew: float | None = None  # the follower's wall clock minus ours, last estimate
    rtt: float | None = None
    _pending_snapshot: list[list[Any]] = field(default_factory=list)

    def ping(self, wall: float) -> list[Any] | None:
        """A clock probe to send now (``wall``: our wall-clock time), once streaming."""
        return ["ping", self.epoch, wall] if self.stage in ("snapshot", "stream") else None

    def receive(self, message: Any, wall: float = 0.0) -> list[Any] | None:
        if not isinstance(message, list) or not message or not isinstance(message[0], str):
            raise Refused("malformed", "not a replication message")
        kind = message[0]
        if kind == "hello" and self.stage == "hello":
            if len(message) not in (3, 4) or not all(map(_uint, message[1:3])):
                raise Refused("malformed", "hello")
            if message[1] > self.epoch:
                raise Refused("newer-epoch", f"the follower knows epoch {message[1]}")
            stated = message[3] if len(message) == 4 else None
            self.refused = self._refusal(stated)
            if self.refused:
                self.stage = "refused"
                return ["refuse", self.refused]
            self.stage = "from"
            epoch, end = self.source.end_of(message[1])
            if stated is None:  # protocol 1: the answer it expects
                return ["end", epoch, end]
            return ["end", epoch, end, _stated(self.speaks, w=self.speaks.log_writes)]
        if kind == "from" and self.stage == "from":
            if len(message) != 3 or not all(map(_uint, message[1:])):
                raise Refused("malformed", "from")
            self._start(message[1], message[2])
            return None
        if kind == "pong" and self.stage in ("snapshot", "stream"):
            if len(message) != 3 or not all(isinstance(t, float) for t in message[1:]):
                raise Refused("malformed", "pong")
            sent, theirs = message[1], message[2]
            if not 0.0 <= wall - sent <= MAX_PING_RTT:
                return None  # an answer to a ping we do not recognise: ignore
            self.rtt = wall - sent
            self.skew = theirs - (sent + self.rtt / 2)
            return None
        if kind == "ack" and self.stage in ("snapshot", "stream"):
            if len(message) != 2 or not _uint(message[1]) or message[1] > self.sent:
                raise Refused("malformed", "ack beyond what was sent")
            self.acked = max(self.acked, message[1])
            return None
        raise Refused("unexpected", f"{kind!r} while waiting for {self.stage}")

    def _refusal(self, stated: Any) -> str:
        """Why this follower cannot follow us ("" if it can): no common protocol, or it
        does not read the log format we write (it would misread every record)."""
        self.peer = _judge(self.follower, stated, self.speaks)
        if self.peer.problem:
            return self.peer.problem
        reads = compat.range_untrusted(stated.get("f")) if isinstance(stated, dict) else None
        reads = reads or compat.OLDEST
        if self.speaks.log_writes not in reads:
            return compat.refusal("log", self.follower, (self.peer.version, reads),
                                  (self.speaks.version, self.speaks.log_writes))  # fmt: skip
        return ""

    def _start(self, epoch: int, lsn: int) -> None:
        shared = lsn == 0 or self.source.epoch_at(lsn) == epoch
        if lsn < self.source.base or not shared or lsn > self.source.last():
            head, entries = self.source.snapshot()
            step = SNAPSHOT_CHUNK
            chunks = [entries[i : i + step] for i in range(0, len(entries), step)] or [[]]
            head_bytes, last = encode(head), len(chunks) - 1
            self._pending_snapshot = [
                ["snapshot", self.epoch, head_bytes, [encode(e) for e in chunk], int(n == last)]
                for n, chunk in enumerate(chunks)
            ]
            # Nothing counts as on its disk until it acknowledges the installed snapshot:
            # counted before, a standby still installing could be elected with an empty log.
            self.sent, self.acked = head.lsn, 0
            self.stage = "snapshot"
        else:
            self.sent = self.acked = lsn
            self.stage = "stream"

    def next_message(self) -> list[Any] | None:
        """What to send now, if anything (call until None after each event)."""
        if self._pending_snapshot:
            message = self._pending_snapshot.pop(0)
            if not self._pending_snapshot:
                self.stage = "stream"
            return message
        if self.stage != "stream" or self.sent - self.acked >= MAX_UNACKED:
            return None
        batch: list[bytes] = []
        size = 0
        for record in self.source.records(self.sent, MAX_BATCH_RECORDS):
            data = encode(record)
            if batch and size + len(data) > MAX_BATCH_BYTES:
                break
            batch.append(data)
            size += len(data)
            self.sent = record.lsn
        return ["records", self.epoch, batch] if batch else None

    @property
    def streaming(self) -> bool:
        """Caught up: everything appended has been sent (acknowledgements may lag)."""
        return self.stage == "stream" and self.sent >= self.source.last()
