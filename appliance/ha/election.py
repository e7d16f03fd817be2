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

import random
from collections import deque

from appliance.ha.acceptor import Acceptor
from appliance.ha.messages import Accepted, Handover, Message, Prepare, Promise, Propose, Release
from appliance.ha.proposer import ALL, Event, Proposer
from appliance.ha.schema import Timing, epoch_quorum, quorum

REQUESTS = (Prepare, Propose, Release)
ANSWERS = (Promise, Accepted, Handover)


class Election:
    def __init__(
        self,
        me: str,
        group: str,
        timing: Timing,
        *,
        peers: list[str],
        witnesses: list[str],
        now: float,
        known_epoch: int,
        incarnation: int,
        rng: random.Random,
        split_brain_opt_in: bool = False,
        maintenance: bool = False,
        restart_wait: float = 0.0,
    ) -> None:
        """``peers``/``witnesses``: addresses of the other acceptors; ``known_epoch``: from
        disk; ``incarnation``: rises with every start (request ids must rise across restarts);
        ``restart_wait``: the longest lease an earlier life may have granted (from disk)."""
        self.me = me
        self.peers = list(peers)
        self.remote = [*peers, *witnesses]
        n = 1 + len(self.remote)
        self.acceptor = Acceptor(
            group, now, max_lease=timing.lease, known_epoch=known_epoch, acceptors=n,
            restart_wait=restart_wait,
        )  # fmt: skip
        self.proposer = Proposer(
            me, group, timing, acceptors=n, quorum=quorum(n, split_brain_opt_in),
            epoch_quorum=epoch_quorum(n, split_brain_opt_in), now=now,
            incarnation=incarnation, rng=rng, maintenance=maintenance,
        )  # fmt: skip
        self.proposer.known_epoch = known_epoch
        self._out: deque[tuple[str, Message]] = deque()

    # -- shell interface ----------------------------------------------------------

    def receive(self, sender: str, address: str, message: Message, now: float) -> None:
        if sender == self.me:
            return  # our own datagram looped back: the local acceptor already saw it
        if isinstance(message, REQUESTS):
            answer = self.acceptor.handle(sender, message, now)
            if answer is not None:
                self._out.append((address, answer))
            if isinstance(message, Release) and self.acceptor.live_grant(now) is None:
                self.proposer.wake(now)
        elif isinstance(message, ANSWERS):
            self.proposer.receive(sender, message, now)
        self._pump(now)

    def get_timer(self) -> float | None:
        return self.proposer.get_timer()

    def handle_timer(self, now: float) -> None:
        self.proposer.handle_timer(now)
        self._pump(now)

    def epoch_to_persist(self) -> int | None:
        epoch, self.acceptor.persist = self.acceptor.persist, None
        return epoch

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
        return {**self.proposer.status(now), "acceptor": self.acceptor.status(now)}

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


class AcceptorSet:
    """A witness: acceptors only, one per group (rack) that asks, diskless, bounded."""

    def __init__(self, max_lease: float, now: float, *, max_groups: int = 256) -> None:
        self.max_lease = max_lease
        self.started = now
        self.max_groups = max_groups
        self.groups: dict[str, Acceptor] = {}
        self.refused_groups = 0

    def receive(self, sender: str, message: Message, now: float) -> Message | None:
        if not isinstance(message, REQUESTS):
            return None
        acceptor = self.groups.get(message.group)
        if acceptor is None:
            if len(self.groups) >= self.max_groups:
                self.refused_groups += 1
                return None
            # Its restart wait counts from the process start, not from first contact.
            acceptor = Acceptor(
                message.group, self.started, max_lease=self.max_lease, known_epoch=None
            )
            self.groups[message.group] = acceptor
        return acceptor.handle(sender, message, now)

    def status(self, now: float) -> dict:
        return {group: a.status(now) for group, a in sorted(self.groups.items())}
