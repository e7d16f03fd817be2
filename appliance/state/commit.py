"""The leader's commit rule and who is declared ineligible (sans-IO).

A record commits once it is durable on the leader and acknowledged by every
other appliance of the rack that is not declared ineligible, where declared
means: in force at a majority of acceptors (the last granted proposal named
it) and still meant (the leader's current wish names it). A standby that
catches up counts again at once, before the acceptors hear of it.

Who to declare is decided only when needed: a standby that holds a record up
(at once if it does not even follow this leader, after ``ack_timeout`` if it
follows but does not acknowledge), or whose wall clock is off by more than
``max_clock_skew``; one declared stays so until it has everything (sent and
acknowledged). A node that does not lead keeps its wish as it is: when it is
elected, its first proposal declares at least those and whom the acceptors that
promised it hold ineligible (appliance/ha/proposer.py), since the previous holder
may have committed without them; each counts again once it has caught up.
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
        self._waiting_since: dict[str, float] = {}  # peer -> when it began holding commits up

    def committable(self, durable: int, followers: Mapping[str, Follower],
                    skip: frozenset[str]) -> int:  # fmt: skip
        """The highest LSN that commits: durable here, acknowledged by all but ``skip``."""
        limit = durable
        for peer in self.peers:
            if peer not in skip:
                follower = followers.get(peer)
                limit = min(limit, follower.acked if follower is not None else 0)
        return limit

    def lagging(self, now: float, *, leading: bool, last: int, pending: bool,
                followers: Mapping[str, Follower], declared: frozenset[str]) -> frozenset[str]:  # fmt: skip
        """Who to declare ineligible now. ``last``: the last LSN appended; ``pending``:
        records wait to commit; ``declared``: the leader's current wish."""
        if not leading:
            self._waiting_since.clear()
            return frozenset(declared)
        out = set()
        for peer in self.peers:
            follower = followers.get(peer)
            if follower is not None and self.skewed(follower):
                out.add(peer)  # its lease expiries would not be ours
            elif follower is not None and follower.acked >= last and follower.streaming:
                self._waiting_since.pop(peer, None)  # has everything: counts
            elif peer in declared:
                out.add(peer)  # still behind
            elif not pending:
                self._waiting_since.pop(peer, None)  # nothing waits for it
            elif (
                follower is None
                or now - self._waiting_since.setdefault(peer, now) > self.ack_timeout
            ):
                out.add(peer)
        return frozenset(out)

    def skewed(self, follower: Follower) -> bool:
        return follower.skew is not None and abs(follower.skew) > self.max_clock_skew
