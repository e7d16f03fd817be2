"""The leader's commit rule and who is declared ineligible (sans-IO).

A record commits once it is durable on the leader and acknowledged by every
other appliance of the rack that is not declared ineligible, where declared
means: in force at a majority of acceptors (the last granted proposal named
it) and still meant (the leader's current wish names it). A standby that
catches up counts again at once, before the acceptors hear of it.

Who to declare is decided only when needed: a standby that holds a record up
(at once if it does not even follow this leader; after ``ack_timeout`` if what
waited for it when the clock started is still unacknowledged: under a steady
load there is always a newer record in flight, so "has everything appended"
is never the test), or whose wall clock is off by more than ``max_clock_skew``.

A declared standby comes back in two steps. Once it streams and has
acknowledged what had been appended when it began to stream, it counts for
commits again (``recounting``): nothing commits any more without it, so it
cannot fall behind the commit point again. Only once it has acknowledged
what had committed at that moment, everything committed without it, is it
no longer declared, and the acceptors hear so at the next round. Clearing it
at the acceptors any earlier could elect it without records committed while
it was declared.

A node that does not lead keeps its wish as it is: when it is elected, its
first proposal declares at least those and whom the acceptors that promised
it hold ineligible (appliance/ha/proposer.py), since the previous holder may
have committed without them; each counts again once it has caught up.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol


class Follower(Protocol):
    acked: int  # the last LSN on its disk
    skew: float | None  # its wall clock minus ours

    @property
    def streaming(self) -> bool: ...  # everything appended was sent to it


class CommitRule:
    def __init__(self, peers: Collection[str], *, ack_timeout: float = 0.5,
                 max_clock_skew: float = 10.0) -> None:  # fmt: skip
        self.peers = tuple(peers)
        self.ack_timeout = ack_timeout
        self.max_clock_skew = max_clock_skew
        # peer -> (when the clock started, the LSN it must acknowledge to restart it)
        self._waiting: dict[str, tuple[float, int]] = {}
        self._streaming_from: dict[str, int] = {}  # declared peer -> last LSN then
        self._recounting: dict[str, int] = {}  # declared peer counted again -> LSN it needs

    @property
    def recounting(self) -> frozenset[str]:
        """Declared appliances that count for commits again (the acceptors not told yet)."""
        return frozenset(self._recounting)

    def committable(self, durable: int, followers: Mapping[str, Follower],
                    skip: frozenset[str]) -> int:  # fmt: skip
        """The highest LSN that commits: durable here, acknowledged by all but ``skip``."""
        limit = durable
        for peer in self.peers:
            if peer not in skip:
                follower = followers.get(peer)
                limit = min(limit, follower.acked if follower is not None else 0)
        return limit

    def lagging(self, now: float, *, leading: bool, last: int, committed: int, pending: bool,
                followers: Mapping[str, Follower], declared: frozenset[str]) -> frozenset[str]:  # fmt: skip
        """Who to declare ineligible now. ``last``: the last LSN appended; ``committed``:
        the commit point; ``pending``: records wait to commit; ``declared``: the leader's
        current wish."""
        if not leading:
            self._waiting.clear()
            self._streaming_from.clear()
            self._recounting.clear()
            return frozenset(declared)
        out = set()
        for peer in self.peers:
            follower = followers.get(peer)
            if follower is not None and self.skewed(follower):
                self._forget(peer)
                out.add(peer)  # its lease expiries would not be ours
            elif peer in declared:
                if self._still_declared(peer, follower, now, last, committed):
                    out.add(peer)
            elif self._holds_up(peer, follower, now, last, pending):
                out.add(peer)
        return frozenset(out)

    def _holds_up(self, peer: str, follower: Follower | None, now: float, last: int,
                  pending: bool) -> bool:  # fmt: skip
        """A counted standby: does it hold commits up for too long?"""
        if follower is not None and follower.acked >= last or not pending:
            self._waiting.pop(peer, None)  # has everything, or nothing waits for it
            return False
        if follower is None:
            return True  # it does not follow: nothing it could acknowledge
        since, target = self._waiting.get(peer, (now, last))
        if follower.acked >= target:  # what waited is acknowledged: time what came since
            since, target = now, last
        self._waiting[peer] = (since, target)
        return now - since > self.ack_timeout

    def _still_declared(self, peer: str, follower: Follower | None, now: float, last: int,
                        committed: int) -> bool:  # fmt: skip
        if follower is None or not follower.streaming and peer not in self._recounting:
            self._forget(peer)
            return True
        if peer in self._recounting:
            if follower.acked >= self._recounting[peer]:
                self._forget(peer)  # it has everything committed without it
                return False
            since, target = self._waiting.get(peer, (now, self._recounting[peer]))
            self._waiting[peer] = (since, target)
            if now - since > self.ack_timeout:
                self._forget(peer)  # counted again, it held commits up: skipped again
            return True
        # What was appended when it was first seen streaming: a standby whose disk hangs
        # acknowledges nothing newer (the commit point it held up proves nothing).
        start = self._streaming_from.setdefault(peer, last)
        if follower.acked >= start:  # close behind: from now on commits wait for it
            del self._streaming_from[peer]
            self._recounting[peer] = committed
            self._waiting[peer] = (now, committed)
        return True

    def _forget(self, peer: str) -> None:
        self._waiting.pop(peer, None)
        self._streaming_from.pop(peer, None)
        self._recounting.pop(peer, None)

    def skewed(self, follower: Follower) -> bool:
        return follower.skew is not None and abs(follower.skew) > self.max_clock_skew
