"""What this software speaks, and whether another node's versions work with it (sans-IO).

Appliances of one rack may run different versions for a while (a rolling
update: docs/updates.md). Each channel between nodes states the sender's
software version and the range of the channel's protocol it speaks:

* the cluster's peer links (``cluster``, the hello of appliance/cluster/session.py),
* the election's datagrams (``election``, every datagram: appliance/ha/messages.py),
* the replication stream (``replication``, the hello and the leader's answer:
  appliance/state/replication.py), which also states the state log's record
  formats: those a follower reads (``log``), the one a leader writes.

Two nodes work together when their ranges overlap: they use the highest protocol
both speak. When they do not, each side refuses the other with one message that
names both versions, both ranges and what to do (:func:`refusal`), counts it and
shows it in status; nothing is misread. A change of a protocol keeps the previous
one in the range for at least one release, so a rolling update (one appliance at a
time) always finds a common one; a node older than version statements states none,
and is taken as speaking protocol 1 of each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from appliance import __version__

UNSTATED = "(older than version statements)"  # what a node that states no version runs


@dataclass(frozen=True)
class Range:
    lo: int
    hi: int

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}"

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.lo <= value <= self.hi

    def common(self, other: Range) -> int | None:
        """The highest protocol both speak, or None."""
        best = min(self.hi, other.hi)
        return best if best >= max(self.lo, other.lo) else None

    def wire(self) -> list[int]:
        return [self.lo, self.hi]


OLDEST = Range(1, 1)  # what a node that states nothing speaks


@dataclass(frozen=True)
class Speaks:
    """One node's software version and the protocol ranges of its channels."""

    version: str
    cluster: Range
    election: Range
    replication: Range
    log: Range  # state log record formats it reads
    log_writes: int  # the format it writes

    def range(self, channel: str) -> Range:
        return getattr(self, channel)


THIS = Speaks(
    __version__,
    cluster=Range(1, 2),  # 2: requests between appliances (the rolling update's)
    election=Range(1, 1),
    replication=Range(1, 2),  # 2: hello and end state versions and log formats
    log=Range(1, 1),
    log_writes=1,
)

NAMES = {
    "cluster": "cluster protocol",
    "election": "election protocol",
    "replication": "replication protocol",
    "log": "state log format",
}


def describe(version: str, what: str, span: Range | int) -> str:
    return f"rackboot {version} ({NAMES[what]} {span})"


def refusal(what: str, peer: str, theirs: tuple[str, Range | int],
            ours: tuple[str, Range | int]) -> str:  # fmt: skip
    """The one line both sides show when ``what`` does not overlap: who runs what, and
    which of the two to update (the one whose range lies wholly below the other's)."""
    (their_version, their_span), (our_version, our_span) = theirs, ours
    top = lambda span: span if isinstance(span, int) else span.hi  # noqa: E731
    ours_older = top(our_span) < top(their_span)
    older, newer = ("this node", their_span) if ours_older else (peer, our_span)
    return (
        f"incompatible {NAMES[what]}: {peer} runs {describe(their_version, what, their_span)}, "
        f"this node runs {describe(our_version, what, our_span)}: update {older} to a "
        f"version that speaks {NAMES[what]} {newer} (a rolling update, one appliance at a "
        "time, never skips a common one)"
    )


def range_untrusted(value: Any) -> Range | None:
    """A stated ``[lo, hi]`` from a peer, or None if it is not one."""
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**16 for v in value)
        and value[0] <= value[1]
    ):
        return Range(value[0], value[1])
    return None


def version_untrusted(value: Any) -> str:
    """A stated software version, shortened; :data:`UNSTATED` for none."""
    return value[:64] if isinstance(value, str) and value else UNSTATED


@dataclass(frozen=True)
class Peer:
    """What a peer stated on one channel, and the verdict."""

    version: str
    span: Range
    agreed: int | None  # the protocol both use; None: incompatible
    problem: str  # the refusal's text ("" when compatible)

    def status(self) -> dict[str, Any]:
        return {"version": self.version, "speaks": str(self.span), "uses": self.agreed,
                "problem": self.problem}  # fmt: skip


def judge(what: str, peer: str, version: Any, span: Any, ours: Speaks = THIS) -> Peer:
    """A peer's statement on channel ``what`` (both unchecked: from the wire; absent,
    None) against ours."""
    theirs = range_untrusted(span) if span is not None else OLDEST
    stated = version_untrusted(version)
    if theirs is None:
        return Peer(stated, OLDEST, None, f"{peer} stated a malformed {NAMES[what]} range")
    mine = ours.range(what)
    agreed = mine.common(theirs)
    problem = "" if agreed is not None else refusal(what, peer, (stated, theirs),
                                                    (ours.version, mine))  # fmt: skip
    return Peer(stated, theirs, agreed, problem)
