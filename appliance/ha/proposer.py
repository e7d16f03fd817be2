"""The proposer (candidate and holder) of the PaxosLease-style election (sans-IO).

A **round** takes the lease, or renews it, in two phases:

1. The proposer notes ``start = now`` *before* sending anything, then sends
   :class:`Prepare` to every acceptor. Its lease, if granted, ends at
   ``start + lease - margin`` on its own clock; every acceptor starts its
   timer of ``lease`` only when the proposal arrives, later, so the holder's
   lease always ends first (by the margin, which covers clock-rate error).
2. On promises from a majority it picks the epoch and sends :class:`Propose`;
   on acceptances from a majority it holds the lease until that deadline.

The **epoch** (fencing token): a holder renewing keeps its epoch. Anyone
else takes ``1 +`` the highest epoch known to the promising majority, and
only when more than ``acceptors - quorum`` of them *remember* (disk-backed,
or diskless ones that never restarted or have learnt the epoch since): no
earlier grant's majority fits among the others, so one of its members is
among them and the new epoch is higher than every epoch granted before. Without such a majority (a
restarted witness while an appliance is down) the proposer waits, unless
an operator forces it (:meth:`Proposer.promote` with ``force``).

Timers: the holder starts a round every ``renew`` seconds; a round has
``renew`` seconds to finish; a holder whose renewals fail steps down
``step_down_lead`` before its validity ends. A candidate told ``busy``
tries again when the majority's grants will have run out.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from dataclasses import dataclass

from appliance.ha.membership import Members
from appliance.ha.messages import (
    Accepted,
    Handover,
    Message,
    Prepare,
    Promise,
    Propose,
    Release,
)
from appliance.ha.schema import Timing

HOLDOFF_LEASES = 2.0  # after handing over, stay away this many lease periods
HANDOVER_WAIT_LEASES = 10.0  # a hand-over asked by a lagging standby waits this long for it
RETRY_JITTER = 0.01  # seconds: spreads candidates that were refused together


@dataclass(frozen=True)
class Acquired:
    epoch: int
    valid_until: float


@dataclass(frozen=True)
class Renewed:
    epoch: int
    valid_until: float


@dataclass(frozen=True)
class Lost:
    epoch: int
    reason: str  # "expired", "released", "handover", "maintenance", "restarted"


Event = Acquired | Renewed | Lost

ALL = "*"  # destination: every acceptor (the shell knows their addresses)


class LeaseTimes:
    """What the embedded and the etcd election share: validity on the node's own clock,
    and stepping down ``step_down_lead`` before it ends."""

    valid_until: float | None
    timing: Timing

    def holding(self, now: float) -> bool:
        return self.valid_until is not None and now < self.valid_until

    def _step_down_times(self) -> list[float]:
        if self.valid_until is None:
            return []
        return [self.valid_until - self.timing.step_down_lead]


@dataclass
class Round:
    req: int
    ballot: int
    start: float
    renewal: bool  # started while holding: keeps the epoch
    epoch: int = 0  # chosen in phase 2
    phase: int = 1
    promises: dict[str, Promise] | None = None
    accepts: dict[str, Accepted] | None = None
    refused: dict[str, Promise | Accepted] | None = None
    free_at: dict[str, float] | None = None  # refusers that named when they will be free
    doomed: bool = False  # refusals left no majority: waiting for the rest of the answers
    forced: bool = False  # an operator's promote --force applies to this round only
    ineligible: frozenset[str] = frozenset()  # what its proposal declares


class Proposer(LeaseTimes):
    def __init__(
        self,
        me: str,
        group: str,
        timing: Timing,
        *,
        members: Members,
        now: float,
        incarnation: int,
        rng: random.Random,
        maintenance: bool = False,
    ) -> None:
        self.me = me
        self.group = group
        self.timing = timing
        self.members = members
        self.acceptors = len(members.acceptors)
        self.quorum = members.quorum
        self.epoch_quorum = members.epoch_quorum
        self._appliances = sorted(members.appliances)
        self.blocked = ""  # why membership forbids taking the lease now (the election says)
        self.strangers = 0  # answers from nodes that are not our acceptors
        self.rng = rng
        self.maintenance = maintenance
        self.known_epoch = 0  # the highest epoch seen in any answer or granted to us
        self.epoch = 0  # ours while holding
        self.valid_until: float | None = None
        self.round: Round | None = None
        self.next_round = now
        self.holdoff_until = 0.0
        self.force_epoch = False  # the next round may pick an epoch without a remembering majority
        self.handover_wanted = False  # promoted: ask the holder we learn of to hand over
        self._handovers_seen: dict[str, int] = {}  # sender -> newest handover request id
        # A hand-over waiting for its successor: (to, wait until, asked by it), and what
        # the last one waited for or why it was given up (status).
        self._handover_to: tuple[str, float, bool] | None = None
        self.handover_note = ""
        # Appliances that have everything committed (the state log's view; None: nobody
        # tracks it, e.g. a rack without replication), and those whose acceptor granted
        # the last round (alive, same membership).
        self.caught_up: frozenset[str] | None = None
        self.last_granted_by: frozenset[str] = frozenset()
        self.in_maintenance: frozenset[str] = frozenset()  # granted it, would not take it
        self.woken = False
        self.ballot = 0
        self._req = (incarnation & 0x7FFFFFFF) << 32
        self.outbox: deque[tuple[str, Message]] = deque()
        self.events: deque[Event] = deque()
        self.last_refusal = ""  # why the last round failed, for status
        self.holder_seen = ("", 0)  # (owner, epoch) of the live lease others report
        # Appliances declared ineligible to take over: what the next proposal says, and what
        # the last granted one said (in force at a majority of acceptors).
        self.wanted_ineligible: frozenset[str] = frozenset()
        self.granted_ineligible: frozenset[str] = frozenset()

    # -- queries ----------------------------------------------------------------

    def get_timer(self) -> float | None:
        times = self._step_down_times()
        if self.round is not None:
            times.append(self._round_end(self.round))
        elif self._may_run():
            times.append(max(self.next_round, self.holdoff_until))
        return min(times) if times else None

    def _may_run(self) -> bool:
        return not self.maintenance

    # -- operator ---------------------------------------------------------------

    def promote(self, now: float, *, force: bool = False) -> None:
        """Become active if allowed: ask the holder to hand over, and try now. ``force``
        applies to one round: a new one, started now (its prepare says so, for acceptors
        that would refuse this node as ineligible), replacing one in its first phase."""
        self.holdoff_until = 0.0
        self.force_epoch = force
        if not self.holding(now):
            self.handover_wanted = True
            self._ask_handover()
            self.next_round = now
            if force and self.round is not None and self.round.phase == 1:
                self.round = None  # its prepare went out unforced: ask again, forced

    def _ask_handover(self) -> None:
        """A hand-over names the holder's epoch: once the lease moved on, a replay is stale."""
        owner, epoch = self.holder_seen
        if self.handover_wanted and owner and owner != self.me and epoch > 0:
            self.handover_wanted = False
            self.outbox.append((ALL, Handover(self.group, self._next_req(), epoch)))

    def hand_over(self, now: float, to: str | None = None) -> None:
        """An operator's graceful hand-over. The holder releases to ``to`` (default: the
        peer appliance that is ready, else the first) once that one has everything
        committed, is not declared ineligible and its acceptor granted the last round, so
        the gap is one round of the successor, not a lease; the release names it, so only
        it tries at once. A node that does not hold asks the holder (as promote does)."""
        peers = sorted(self.members.peers)
        if to is not None and to != self.me and to not in peers:
            raise ValueError(f"{to} is not an appliance of this rack ({', '.join(peers)})")
        if not self.holding(now):
            if to not in (None, self.me):
                raise ValueError(
                    f"this node does not hold the lease: run the hand-over to {to} on the "
                    "active appliance, or without a target here to take the lease"
                )
            self.promote(now)
            return
        if to == self.me or not peers:
            raise ValueError("this node holds the lease already: name another appliance")
        if to is None:
            to = min(peers, key=lambda peer: (self._not_ready(peer, asked=False) != "", peer))
        self._handover_to = (to, now + HANDOVER_WAIT_LEASES * self.timing.lease, False)
        self._maybe_hand_over(now)

    def set_caught_up(self, appliances: frozenset[str], now: float) -> None:
        """The state log's view changed: a waiting hand-over may go now."""
        self.caught_up = frozenset(appliances)
        self._maybe_hand_over(now)

    def demote(self, now: float) -> None:
        """Step down (if holding) and leave the lease to the others for a while."""
        self.holdoff_until = now + HOLDOFF_LEASES * self.timing.lease
        self._release(now, "released")

    def set_maintenance(self, on: bool, now: float) -> None:
        self.maintenance = on
        if on:
            self._release(now, "maintenance")
        else:
            self.next_round = now
            self.holdoff_until = 0.0  # an operator's word outranks an earlier hand-over

    def shutdown(self, now: float) -> None:
        self.maintenance = True
        self._release(now, "released")

    def wake(self, now: float, ballot: int = 0) -> None:
        """An acceptor freed a grant (a release reached us): try now rather than later
        (or as soon as the round in flight fails, if it was refused before the release),
        with a ballot above the releasing holder's (``ballot``) if it named us."""
        self.woken = True
        self.ballot = max(self.ballot, ballot)
        if ballot:
            # Named successor: the holder asks this node to take over, whatever hold-off an
            # earlier hand-over of its own left it; a round asked before the release
            # (refused busy, or waiting for an answer to its timeout) is dropped for one
            # asked now: dropping a round in its first phase is always safe (its late
            # answers no longer match).
            self.holdoff_until = 0.0
            if self.round is not None and self.round.phase == 1 and not self.holding(now):
                self.round = None
        if self.round is None and not self.holding(now):
            self.next_round = min(self.next_round, now)

    # -- timers -----------------------------------------------------------------

    def handle_timer(self, now: float) -> None:
        if self.valid_until is not None and now >= self.valid_until - self.timing.step_down_lead:
            self._lose(now, "expired")
        if self.round is not None and now >= self._round_end(self.round):
            # a holder retries at once (below); a candidate nobody answers is in no hurry
            rnd = self.round
            retry = self._retry_after(rnd, now) if rnd.doomed else self.timing.renew
            self._fail(now, self._timeout_reason(rnd), retry=retry)
        if (
            self.round is None
            and self._may_run()
            and now >= max(self.next_round, self.holdoff_until)
        ):
            self._start(now)

    def _start(self, now: float) -> None:
        renewal = self.holding(now)
        self.woken = False
        self.ballot += 1
        self.round = Round(
            self._next_req(), self.ballot, now, renewal, promises={}, refused={}, free_at={},
            forced=self.force_epoch,
        )  # fmt: skip
        self.force_epoch = False
        self.outbox.append((ALL, Prepare(
            self.group, self.round.req, self.ballot, self.members.digest, self._appliances,
            force=self.round.forced,
        )))  # fmt: skip

    def _next_req(self) -> int:
        self._req += 1
        return self._req

    # -- answers ----------------------------------------------------------------

    def receive(self, sender: str, message: Message, now: float) -> None:
        if isinstance(message, Handover):
            self._handover(sender, message, now)
            return
        rnd = self.round
        if rnd is None or getattr(message, "req", None) != rnd.req:
            return  # an answer to an older round, or a duplicate
        if sender not in self.members.acceptors:
            self.strangers += 1  # only the configured acceptors count, whoever signs
            return
        if message.ok and (message.promised_by != self.me or message.promised_n != rnd.ballot
                           or message.ballot != rnd.ballot):  # fmt: skip
            return  # a yes to someone else's round with the same request id: a replay
        if message.ok and message.members != self.members.digest:
            message = dataclasses.replace(message, ok=False, why="mismatch")
        self.known_epoch = max(self.known_epoch, message.known_epoch)
        if not message.ok:
            self._refused(sender, message, now)
        elif isinstance(message, Promise) and rnd.phase == 1:
            rnd.promises[sender] = message
            self._maybe_propose(now)
            self._end_if_doomed(now)
        elif isinstance(message, Accepted) and rnd.phase == 2:
            rnd.accepts[sender] = message
            if len(rnd.accepts) >= self.quorum:
                self._granted(now)
            else:
                self._end_if_doomed(now)

    def _handover(self, sender: str, message: Handover, now: float) -> None:
        """Release for a fresh request from one of the rack's appliances naming our rack and
        the epoch we hold, nothing else."""
        if (
            sender not in self.members.peers
            or message.req <= self._handovers_seen.get(sender, -1)
            or message.group != self.group
        ):
            return
        self._handovers_seen[sender] = message.req
        if self.holding(now) and message.epoch == self.epoch:
            self._handover_to = (sender, now + HANDOVER_WAIT_LEASES * self.timing.lease, True)
            self._maybe_hand_over(now)

    def _maybe_hand_over(self, now: float) -> None:
        """Release to the successor once it is ready (:meth:`_not_ready`): released
        earlier, it would be refused (ineligible), lack records, or not be there, and the
        rack left without a holder until someone took the lease again. A lagging standby
        usually catches up within a renewal; one that does not in time is not waited for."""
        if self._handover_to is None:
            return
        who, until, asked = self._handover_to
        waiting = self._not_ready(who, asked)
        if now > until or not self.holding(now):
            self._handover_to = None
            if now > until:
                self.handover_note = f"hand-over to {who} given up: {waiting}"
        elif waiting:
            self.handover_note = f"hand-over to {who} waits: {waiting}"
        else:
            self._handover_to = None
            self.handover_note = f"handed over to {who}"
            self.holdoff_until = now + HOLDOFF_LEASES * self.timing.lease
            self._release(now, "handover", to=who)

    def _not_ready(self, who: str, asked: bool) -> str:
        """Why ``who`` may not take the lease from us now ("" if it may)."""
        if who in self.granted_ineligible | self.wanted_ineligible:
            return "declared ineligible (it lags the state log)"
        if self.caught_up is not None and who not in self.caught_up:
            return "not caught up with the state log"
        if who in self.in_maintenance:
            return "in maintenance: it would not take the lease"
        if not asked and who not in self.last_granted_by:
            return "its acceptor did not grant the last renewal (down, or another membership)"
        return ""

    def _refused(self, sender: str, message: Promise | Accepted, now: float) -> None:
        rnd = self.round
        assert rnd is not None
        if isinstance(message, Promise) != (rnd.phase == 1):
            return  # a refusal of the other phase: that phase is over
        rnd.refused[sender] = message
        if message.why in ("busy", "restarting"):
            rnd.free_at[sender] = now + message.left
        elif message.why == "lease-too-long":
            # Others may have granted this longer lease (its own acceptor, a witness): asking
            # again as those grants end would renew them, and the appliances on the shorter
            # lease would be told busy for ever (a rolling lease change). Stay away for two
            # leases: the grants run out and the others, asking then, elect one of them.
            rnd.free_at[sender] = now + 2 * self.timing.lease
        if message.why == "busy":
            self.holder_seen = (message.owner, getattr(message, "owner_epoch", 0))
            self._ask_handover()
        self.ballot = max(self.ballot, message.promised_n)
        if self.acceptors - len(rnd.refused) < self.quorum:
            rnd.doomed = True
        self._end_if_doomed(now)

    def _end_if_doomed(self, now: float) -> None:
        """A round with no majority left ends once every acceptor answered (or at its
        timeout), so the retry is timed by all the grants, not by the first refusals."""
        rnd = self.round
        if rnd is None or not rnd.doomed:
            return
        answered = len(rnd.promises if rnd.phase == 1 else rnd.accepts) + len(rnd.refused)
        if answered >= self.acceptors or self.holding(now):
            self._fail(now, self._reason(rnd), retry=self._retry_after(rnd, now))

    def _maybe_propose(self, now: float) -> None:
        rnd = self.round
        assert rnd is not None and rnd.promises is not None
        if len(rnd.promises) < self.quorum:
            return
        if rnd.renewal and self.holding(now):
            epoch = self.epoch
        elif self.blocked and not rnd.forced:
            self._fail(now, self.blocked, retry=self.timing.renew)
            return
        else:
            remembering = [p for p in rnd.promises.values() if not p.amnesic]
            if len(remembering) < self.epoch_quorum and not rnd.forced:
                if len(rnd.promises) + len(rnd.refused) >= self.acceptors:
                    self._fail(now, "amnesic", retry=self.timing.renew)
                return  # wait: a remembering acceptor may still answer
            epoch = max(self.known_epoch, *(p.known_epoch for p in rnd.promises.values())) + 1
        rnd.phase, rnd.epoch, rnd.accepts = 2, epoch, {}
        rnd.refused, rnd.free_at = {}, {}
        if not rnd.renewal:
            # Whom the majority that promised holds ineligible stays so: the previous
            # holder may have committed without them, and clearing them now would let one
            # be elected later without those records. They count again once caught up.
            held = {n for p in rnd.promises.values() for n in p.ineligible}
            self.wanted_ineligible |= frozenset(held & set(self.members.peers))
        rnd.ineligible = self.wanted_ineligible
        self.outbox.append((ALL, Propose(
            self.group, rnd.req, rnd.ballot, epoch, self.timing.lease, self.members.digest,
            self._appliances, ineligible=sorted(rnd.ineligible), force=rnd.forced,
        )))  # fmt: skip

    def _granted(self, now: float) -> None:
        rnd = self.round
        assert rnd is not None
        self.round = None
        valid_until = rnd.start + self.timing.usable
        self.next_round = rnd.start + self.timing.renew
        was_holding = self.holding(now)
        if rnd.renewal and not was_holding:
            # the lease ran out while this renewal was on its way (a paused process):
            # step down; the next round takes a new epoch
            self._lose(now, "expired")
            return
        if now >= valid_until - self.timing.step_down_lead:
            self.last_refusal = "granted too late"
            return
        self.valid_until, self.epoch = valid_until, rnd.epoch
        self.granted_ineligible = rnd.ineligible
        accepts = rnd.accepts or {}
        self.last_granted_by = frozenset(n for n, a in accepts.items() if a.available)
        self.in_maintenance = frozenset(n for n, a in accepts.items() if not a.available)
        if self.wanted_ineligible != rnd.ineligible:
            self.next_round = now  # the wish changed while this round was out: tell them now
        self.known_epoch = max(self.known_epoch, rnd.epoch)
        self.handover_wanted = False
        self.last_refusal = ""
        self.holder_seen = (self.me, rnd.epoch)
        self.events.append(
            Renewed(rnd.epoch, valid_until) if was_holding else Acquired(rnd.epoch, valid_until)
        )
        self._maybe_hand_over(now)

    # -- failures ---------------------------------------------------------------

    def _reason(self, rnd: Round) -> str:
        return ",".join(sorted({m.why for m in rnd.refused.values()})) or "no majority"

    def _timeout_reason(self, rnd: Round) -> str:
        if rnd.doomed:
            return self._reason(rnd)
        if rnd.phase == 1 and len(rnd.promises) >= self.quorum:
            return "amnesic"  # a majority answered, but not a majority that remembers epochs
        return f"timeout in phase {rnd.phase}" + (f" ({self._reason(rnd)})" if rnd.refused else "")

    def _round_end(self, rnd: Round) -> float:
        """A round ends at its timeout; a doomed one also once a majority of the acceptors
        that refused it as busy will be free (retrying then may succeed; an answer still
        missing, say from the dead holder's own acceptor, could only make that sooner).
        It waited for its timeout: when the grants it was told of ran out first, that was
        up to ``round_timeout`` added to a failover."""
        end = rnd.start + self.timing.round_timeout
        if rnd.doomed and len(rnd.free_at) >= self.quorum:
            end = min(end, sorted(rnd.free_at.values())[self.quorum - 1])
        return end

    def _retry_after(self, rnd: Round, now: float) -> float:
        """Seconds until a majority's grants (or restart waits) will have run out."""
        answered = rnd.promises if rnd.phase == 1 else rnd.accepts
        free_in = sorted([0.0] * len(answered) + [max(0.0, t - now) for t in rnd.free_at.values()])
        if len(free_in) >= self.quorum and (free_in[self.quorum - 1] > 0 or rnd.free_at):
            # When the grants named have already run out (the round waited for its timeout,
            # a dead acceptor never answering), retry now: after a crash this is the
            # failover's tail (up to renew/2 of it, before).
            return free_in[self.quorum - 1] + self.rng.uniform(0, RETRY_JITTER)
        return self.rng.uniform(0, self.timing.renew / 2)

    def _fail(self, now: float, reason: str, *, retry: float) -> None:
        self.round = None
        self.last_refusal = reason
        if self.holding(now):
            retry = min(retry, self.timing.renew / 4)
        if self.woken:
            retry = min(retry, self.rng.uniform(0, RETRY_JITTER))
        self.next_round = now + retry

    def _release(self, now: float, reason: str, to: str = "") -> None:
        if self.valid_until is None:
            return
        epoch = self.epoch
        self._lose(now, reason)
        self.outbox.append((ALL, Release(
            self.group, self._next_req(), epoch, stated=True,
            ineligible=sorted(self.wanted_ineligible), to=to, ballot=self.ballot if to else 0,
        )))  # fmt: skip

    def _lose(self, now: float, reason: str) -> None:
        if self.valid_until is None:
            return
        self.valid_until = None
        self.round = None  # a late grant of the current round must not revive us
        self.next_round = now
        self.holder_seen = ("", 0)
        self.events.append(Lost(self.epoch, reason))

    # -- status -----------------------------------------------------------------

    def status(self, now: float) -> dict:
        return {
            "holding": self.holding(now),
            "epoch": self.epoch if self.holding(now) else None,
            "valid_for": round(self.valid_until - now, 3) if self.holding(now) else 0.0,
            "known_epoch": self.known_epoch,
            "maintenance": self.maintenance,
            "holdoff": round(max(0.0, self.holdoff_until - now), 3),
            "holder_seen": self.holder_seen[0],
            "last_refusal": self.last_refusal,
            "acceptors": self.acceptors,
            "quorum": self.quorum,
            "strangers": self.strangers,
            "ineligible": sorted(self.granted_ineligible) if self.holding(now) else [],
            # what this node means to declare (the next round's set; a release states it)
            "declaring": sorted(self.wanted_ineligible) if self.holding(now) else [],
            "handover": self._handover_status(now),
        }

    def _handover_status(self, now: float) -> dict:
        pending = self._handover_to
        return {
            "to": pending[0] if pending else "",
            "left": round(max(0.0, pending[1] - now), 3) if pending else 0.0,
            "note": self.handover_note,
        }
