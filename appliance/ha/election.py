"""One appliance's side of the election: its proposer and its own acceptor (sans-IO).

The shell feeds verified datagrams with :meth:`Election.receive` (sender's
node id and address, the decoded message, ``now``), arms
:meth:`get_timer` and calls :meth:`handle_timer`, then, in this order:

1. writes :meth:`epoch_to_persist` durably if it is not None (an acceptor
   never answers with an epoch a crash could make it forget);
2. sends :meth:`datagrams_to_send` (address, message) pairs;
3. applies :meth:`next_event` (:class:`Acquired`, :class:`Renewed`, :class:`Lost`)
   to the node's role, fence and virtual IP.

Messages the proposer sends to every acceptor reach the local acceptor
here, at once; its answers come straight back. A witness runs only
:class:`~appliance.ha.acceptor.Acceptor` objects (see :class:`AcceptorSet`).
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from appliance.ha.acceptor import Acceptor
from appliance.ha.membership import Members
from appliance.ha.messages import Accepted, Handover, Message, Prepare, Promise, Propose, Release
from appliance.ha.proposer import ALL, Event, Proposer
from appliance.ha.schema import Timing

REQUESTS = (Prepare, Propose, Release)
ANSWERS = (Promise, Accepted, Handover)


class Election:
    def __init__(
        self,
        me: str,
        group: str,
        timing: Timing,
        *,
        peers: Mapping[str, str] | list[str],
        witnesses: Mapping[str, str] | list[str],
        now: float,
        known_epoch: int,
        incarnation: int,
        rng: random.Random,
        split_brain_opt_in: bool = False,
        maintenance: bool = False,
        restart_wait: float = 0.0,
        confirmed: str = "",
        ineligible: frozenset[str] = frozenset(),
    ) -> None:
        """``peers``/``witnesses``: node id -> address of the other acceptors (a list names
        acceptors whose address is their id, as in tests); ``known_epoch``: from disk;
        ``incarnation``: rises with every start (request ids must rise across restarts);
        ``restart_wait``: the longest lease an earlier life may have granted; ``confirmed``:
        the membership digest every peer was last seen to share; ``ineligible``: the
        appliances the last proposal this acceptor accepted declared ineligible (all four
        from disk)."""
        peers, witnesses = _by_id(peers), _by_id(witnesses)
        self.me = me
        self.members = Members.of(me, peers, witnesses, split_brain_opt_in)
        self.peers = list(peers.values())
        self.remote = [*peers.values(), *witnesses.values()]
        self.acceptor = Acceptor(
            group, now, max_lease=timing.lease, known_epoch=known_epoch, members=self.members,
            restart_wait=restart_wait, ineligible=ineligible,
        )  # fmt: skip
        self.proposer = Proposer(
            me, group, timing, members=self.members, now=now, incarnation=incarnation, rng=rng,
            maintenance=maintenance,
        )  # fmt: skip
        self.proposer.known_epoch = known_epoch
        self.confirmed = confirmed == self.members.digest
        self.seen: dict[str, str] = {}  # peer appliance -> the membership digest it last sent
        self._confirm: str | None = None
        self.settled_at = 0.0  # a newly confirmed membership takes no lease before this
        self.notices: deque[str] = deque(maxlen=16)  # for the log: membership disagreements
        self._out: deque[tuple[str, Message]] = deque()
        self._judge(now)

    # -- shell interface ----------------------------------------------------------

    def receive(self, sender: str, address: str, message: Message, now: float) -> None:
        if sender == self.me:
            return  # our own datagram looped back: the local acceptor already saw it
        if sender in self.members.peers and hasattr(message, "members"):
            if self.seen.get(sender) != message.members != self.members.digest:
                self.notices.append(
                    f"appliance {sender} runs another membership ({message.members} where "
                    f"this node has {self.members.digest}): no lease for this node until "
                    "their [ha] peers and witnesses agree"
                )  # fmt: skip
            self.seen[sender] = message.members
        self._judge(now)
        if isinstance(message, REQUESTS):
            answer = self.acceptor.handle(sender, message, now)
            if isinstance(answer, Accepted) and self.proposer.maintenance:
                answer = dataclasses.replace(answer, available=False)
            if answer is not None:
                self._out.append((address, answer))
            if (
                isinstance(message, Release)
                and message.to in ("", self.me)
                and self.acceptor.live_grant(now) is None
            ):
                self.proposer.wake(now, message.ballot if message.to == self.me else 0)
        elif isinstance(message, ANSWERS):
            self.proposer.receive(sender, message, now)
        self._pump(now)

    def get_timer(self) -> float | None:
        return self.proposer.get_timer()

    def handle_timer(self, now: float) -> None:
        self._judge(now)
        self.proposer.handle_timer(now)
        self._pump(now)

    def confirmed_to_persist(self) -> str | None:
        """A membership digest every peer appliance was seen to share, once, to keep."""
        digest, self._confirm = self._confirm, None
        return digest

    def epoch_to_persist(self) -> int | None:
        epoch, self.acceptor.persist = self.acceptor.persist, None
        return epoch

    def ineligible_to_persist(self) -> frozenset[str] | None:
        """The acceptor's new set of ineligible appliances, to keep before it answers."""
        ineligible, self.acceptor.persist_ineligible = self.acceptor.persist_ineligible, None
        return ineligible

    def set_ineligible(self, appliances: frozenset[str], now: float) -> bool:
        """The appliances this node, as holder, declares ineligible (replication: a standby
        that does not acknowledge the state log). A holder whose set changed renews at once,
        so the acceptors learn it within a round; True when the timer moved."""
        wanted = frozenset(appliances) & frozenset(self.members.peers)
        proposer = self.proposer
        if wanted == proposer.wanted_ineligible or not proposer.holding(now):
            # Not holding, the wish is kept: the round that makes this node holder declares
            # at least it and whom the promising acceptors hold ineligible (proposer.py).
            return False
        proposer.wanted_ineligible = wanted
        if proposer.holding(now) and proposer.round is None:
            proposer.next_round = min(proposer.next_round, now)
            return True
        return False

    def datagrams_to_send(self) -> list[tuple[str, Message]]:
        out = list(self._out)
        self._out.clear()
        return out

    def next_event(self) -> Event | None:
        events = self.proposer.events
        return events.popleft() if events else None

    # -- operator -----------------------------------------------------------------

    def promote(self, now: float, *, force: bool = False) -> None:
        self.proposer.promote(now, force=force)
        self.handle_timer(now)

    def hand_over(self, now: float, to: str | None = None) -> None:
        """:meth:`Proposer.hand_over`; ValueError names what is wrong with ``to``."""
        self.proposer.hand_over(now, to)
        self.handle_timer(now)

    def set_caught_up(self, appliances: frozenset[str], now: float) -> bool:
        """The appliances that have everything committed (the state log says); True when
        that released the lease (the shell sends the release at once)."""
        holding = self.proposer.holding(now)
        self.proposer.set_caught_up(appliances, now)
        self._pump(now)
        return holding and not self.proposer.holding(now)

    def demote(self, now: float) -> None:
        self.proposer.demote(now)
        self._pump(now)

    def set_maintenance(self, on: bool, now: float) -> None:
        self.proposer.set_maintenance(on, now)
        self.handle_timer(now)

    def shutdown(self, now: float) -> None:
        self.proposer.shutdown(now)
        self._pump(now)

    # -- queries ------------------------------------------------------------------

    @property
    def maintenance(self) -> bool:
        return self.proposer.maintenance

    @property
    def valid_until(self) -> float | None:
        return self.proposer.valid_until

    def holding(self, now: float) -> bool:
        return self.proposer.holding(now)

    def status(self, now: float) -> dict:
        membership = {
            "digest": self.members.digest,
            "confirmed": self.confirmed,
            "blocked": self.proposer.blocked,
            "peers": {peer: self.seen.get(peer, "") for peer in sorted(self.members.peers)},
        }
        return {
            **self.proposer.status(now), "acceptor": self.acceptor.status(now),
            "membership": membership,
        }  # fmt: skip

    def _judge(self, now: float) -> None:
        """May this node take the lease, as far as membership goes? Not while a peer
        appliance was last seen with another membership (``mismatch``), nor with a
        membership no peer has confirmed yet (``unconfirmed``): a new or changed
        configuration must first be seen on every other appliance of the rack, so two
        disagreeing configurations never elect by disjoint majorities, partitioned or not.
        Once confirmed, not for one more restart wait (``settling``): a grant of the old
        configuration may still run at acceptors the new one does not ask, and it ends
        at most that long after the last old-configuration process died."""
        digest = self.members.digest
        if any(seen != digest for seen in self.seen.values()):
            self.proposer.blocked = "mismatch"
        elif not self.confirmed and all(self.seen.get(p) == digest for p in self.members.peers):
            self.confirmed, self._confirm = True, digest
            self.settled_at = now + self.acceptor.restart_wait
        if self.proposer.blocked == "mismatch" and any(
            seen != digest for seen in self.seen.values()
        ):
            return
        if not self.confirmed:
            self.proposer.blocked = "unconfirmed"
        elif now < self.settled_at:
            self.proposer.blocked = "settling"
        else:
            self.proposer.blocked = ""

    # -- internals ----------------------------------------------------------------

    def _pump(self, now: float) -> None:
        """Deliver the proposer's messages: to the local acceptor at once, the rest out."""
        outbox = self.proposer.outbox
        while outbox:
            destination, message = outbox.popleft()
            assert destination == ALL
            targets = self.peers if isinstance(message, Handover) else self.remote
            self._out.extend((address, message) for address in targets)
            if isinstance(message, REQUESTS):
                answer = self.acceptor.handle(self.me, message, now)
                if answer is not None:
                    self.proposer.receive(self.me, answer, now)


@dataclass
class RackAcceptor:
    """A witness's acceptor for one rack: racks are told apart by their appliances."""

    appliances: set[str]
    acceptor: Acceptor


class AcceptorSet:
    """A witness: acceptors only, diskless, bounded. It has no configuration of the racks
    it serves, so a rack is the rack name (two racks keeping the default name must not
    share a lease) and the appliances its proposers list: a request joins the acceptor
    whose appliances it shares. A request matching two is refused (counted)."""

    def __init__(self, max_lease: float, now: float, *, max_groups: int = 256) -> None:
        self.max_lease = max_lease
        self.started = now
        self.max_groups = max_groups
        self.groups: dict[str, list[RackAcceptor]] = {}
        self.refused_groups = 0
        self.ambiguous = 0

    def receive(self, sender: str, message: Message, now: float) -> Message | None:
        if not isinstance(message, REQUESTS):
            return None
        acceptor = self._acceptor(sender, message)
        return None if acceptor is None else acceptor.handle(sender, message, now)

    def _acceptor(self, sender: str, message: Prepare | Propose | Release) -> Acceptor | None:
        racks = self.groups.setdefault(message.group, [])
        listed = getattr(message, "appliances", None)
        ids = set(listed) if listed is not None else {sender}
        found = [rack for rack in racks if rack.appliances & ids]
        if len(found) > 1:
            self.ambiguous += 1
            return None
        if found:
            if listed is not None:
                found[0].appliances |= ids  # a rolling change of the rack's appliances
            return found[0].acceptor
        if listed is None:
            return None  # a release for a rack this witness never voted for
        if sum(map(len, self.groups.values())) >= self.max_groups:
            self.refused_groups += 1
            return None
        # Its restart wait counts from the process start, not from first contact.
        acceptor = Acceptor(message.group, self.started, max_lease=self.max_lease, known_epoch=None)
        racks.append(RackAcceptor(ids, acceptor))
        return acceptor

    def status(self, now: float) -> dict:
        out = {}
        for group, racks in sorted(self.groups.items()):
            for n, rack in enumerate(racks):
                key = group if n == 0 else f"{group}#{n + 1}"
                out[key] = {**rack.acceptor.status(now), "appliances": sorted(rack.appliances)}
        return out


def _by_id(acceptors: Mapping[str, str] | list[str]) -> dict[str, str]:
    return dict(acceptors) if isinstance(acceptors, Mapping) else {a: a for a in acceptors}
