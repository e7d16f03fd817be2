"""Who votes in a rack's election, and the digest that proves two appliances agree (sans-IO).

A rack's acceptors are its appliances and its witnesses, named by node id
(the id in each one's cluster certificate) in ``[ha] peers`` and
``witnesses`` as ``NODE-ID@host:port``. Every prepare and propose carries
the digest of the proposer's membership and the ids of its appliances;
every answer carries the digest the acceptor judged by. Counting is not
enough: two appliances that list the same number of acceptors but a
different witness each have majorities that need not meet.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import msgpack

from appliance.ha.schema import epoch_quorum, quorum


@dataclass(frozen=True)
class Members:
    me: str
    appliances: frozenset[str]  # this node included
    witnesses: frozenset[str]
    split_brain_opt_in: bool = False
    digest: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        assert self.me in self.appliances
        body = [sorted(self.appliances), sorted(self.witnesses), self.split_brain_opt_in]
        digest = hashlib.sha256(msgpack.packb(body)).hexdigest()[:32]
        object.__setattr__(self, "digest", digest)

    @classmethod
    def of(cls, me: str, peers, witnesses, split_brain_opt_in: bool = False) -> Members:
        return cls(me, frozenset([me, *peers]), frozenset(witnesses), split_brain_opt_in)

    @property
    def acceptors(self) -> frozenset[str]:
        return self.appliances | self.witnesses

    @property
    def peers(self) -> frozenset[str]:
        """The other appliances: the ones whose membership must match ours."""
        return self.appliances - {self.me}

    @property
    def quorum(self) -> int:
        return quorum(len(self.acceptors), self.split_brain_opt_in)

    @property
    def epoch_quorum(self) -> int:
        return epoch_quorum(len(self.acceptors), self.split_brain_opt_in)
