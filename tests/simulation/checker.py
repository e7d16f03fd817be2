"""The invariants, checked as things happen, in true time (trio's clock).

The lease:

* at most one node holds a valid lease at any instant;
* epochs only rise: each acquisition takes an epoch above every epoch granted before
  (except the round an operator forced with ``promote --force``: docs/ha.md, "The
  witness and epochs"), and a holder renews with its own;
* a node back from a pause past its lease steps down before doing anything else;
* an acceptor accepts a round's proposal at most once per life (an adversary replays
  captured frames throughout);
* a hand-over request moves the lease at most once, and only the holding whose epoch it
  names (a replayed one moves nothing).

Outward effects. A plugin's send path asks the fence, then the datagram leaves, as a
step of its own: the process may be stopped between the two for any time. Nothing in
the sender can prevent a send that leaves long after its check, so the guarantee has
two parts, one per side:

* **the sender** (``fence_checked``, ``sent``): every fence check that says yes happens
  while that node is the only node with a valid lease; every effect leaves on such a
  yes; and one that leaves within ``COVER`` of its yes leaves while no other node holds
  a valid lease. ``COVER`` is the scheduling jitter the margin is sized for
  (``margin >= 2 * max_clock_rate_error * lease + MIN_MARGIN``): after the holder's
  validity ends, every grant it rests on still runs for that long. A send that leaves
  later is *late*: counted, and judged by the receiver;
* **the receiver** (``resource``): a fenced resource (what the replicated state log will
  be) rejects an effect whose epoch is below the highest it has accepted. Its rule is
  part of the model; the checker asserts what the rule is for: in the order the resource
  accepts effects, holdings never go backwards, so a deposed holder's effect is never
  accepted once its successor's was. That holds only if epochs rise with every
  acquisition, which is what it checks at the receiver. (A deposed holder's late effect
  that arrives before its successor's first one is accepted: it is ordered before all of
  the successor's, as if sent in time. Fencing tokens promise no more.)

A holder's validity is recorded in true time, converted from its own clock; it stays
recorded when the process dies (the acceptors' grants still run).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import trio

from appliance.ha.schema import MIN_MARGIN

COVER = MIN_MARGIN  # seconds between a fence check and its send that the margin covers


@dataclass
class Holding:
    epoch: int
    until: float  # true time
    tenure: int  # which acquisition, numbered in true-time order


@dataclass
class Ticket:
    """A yes from a node's fence, for the effect about to leave."""

    at: float
    tenure: int
    epoch: int


class Violation(AssertionError):
    pass


class Checker:
    def __init__(self, world) -> None:
        self.world = world
        self.holdings: dict[str, Holding] = {}
        self.max_epoch = 0
        self.forced_epochs: set[int] = set()  # epochs an operator's forced round took again
        self.last_holder = ""
        self.seen: Counter[str] = Counter()  # what the run exercised, for the tests' floors
        self.violations: list[str] = []
        self._accepted: set[tuple[str, int, str, int]] = set()  # acceptor, life, proposer, round
        self._handovers: set[tuple[str, int]] = set()  # (sender, req) that moved a lease
        self._tickets: dict[str, Ticket] = {}
        self._newest_at_resource: Holding | None = None

    def fail(self, text: str) -> None:
        line = f"t={trio.current_time():.6f} {text}"
        self.world.note(f"VIOLATION {text}")
        self.violations.append(line)

    def _others_valid(self, name: str, now: float) -> list[str]:
        return [n for n, h in self.holdings.items() if n != name and h.until > now]

    # -- the lease ------------------------------------------------------------------

    def granted(self, process, epoch: int, valid_until: float, renewal: bool, forced: bool) -> None:
        now = trio.current_time()
        until = process.clock.to_trio(valid_until)
        self.seen["grants"] += 1
        for name in self._others_valid(process.name, now):
            other = self.holdings[name]
            self.fail(
                f"two holders: {process.name} (epoch {epoch}) while {name} (epoch "
                f"{other.epoch}) is valid for {other.until - now:.6f} s more"
            )
        mine = self.holdings.get(process.name)
        if renewal:
            if mine is None or mine.epoch != epoch:
                self.fail(f"{process.name} renewed epoch {epoch}, it held {mine}")
            tenure = mine.tenure if mine else -1
        else:
            tenure = self._acquired(process, epoch, forced)
        if until <= now:
            self.fail(f"{process.name} granted a lease already over")
        self.max_epoch = max(self.max_epoch, epoch)
        self.holdings[process.name] = Holding(epoch, until, tenure)
        self._count_adversarial(process, valid_until)

    def _acquired(self, process, epoch: int, forced: bool) -> int:
        self.seen["acquisitions"] += 1
        self.seen["forced acquisitions"] += forced
        if self.last_holder and self.last_holder != process.name:
            self.seen["failovers"] += 1
        self.last_holder = process.name
        if epoch <= self.max_epoch:
            if forced:  # the documented exception: the operator vouched for it
                self.forced_epochs.add(epoch)
            else:
                self.fail(f"epoch did not rise: {process.name} took {epoch} after {self.max_epoch}")
        return self.seen["acquisitions"]

    def _count_adversarial(self, process, valid_until: float) -> None:
        """The cases the adversarial timing sets are for, counted so a test sees them."""
        rates = [p.clock.rate for p in self.world.processes.values() if p is not process]
        if process.clock.rate < min(rates) and len(set(rates)) == 1:
            self.seen["slowest holder, fastest acceptors"] += 1
        timing = process.timing
        took = process.clock.now() - (valid_until - timing.usable)  # since the round's start
        if took > 0.75 * timing.round_timeout:
            self.seen["grants near the round timeout"] += 1

    def lost(self, process) -> None:
        mine = self.holdings.get(process.name)
        if mine is not None:
            mine.until = min(mine.until, trio.current_time())

    def accepted(self, process, proposer: str, req: int) -> None:
        """An acceptor accepts a round's proposal once per life: a replay is not a vote."""
        key = (process.name, process.incarnation, proposer, req)
        if key in self._accepted:
            self.fail(f"{process.name} accepted {proposer}'s proposal of round {req} twice")
        self._accepted.add(key)

    def handed_over(self, process, sender: str, request, epoch: int) -> None:
        """A holder released for ``sender``'s hand-over request (the frame that did it)."""
        self.seen["hand-overs"] += 1
        key = (sender, request.req)
        if key in self._handovers:
            self.fail(f"{process.name} handed over again for {sender}'s request {request.req}")
        self._handovers.add(key)
        if request.epoch != epoch:
            self.fail(
                f"{process.name} handed over epoch {epoch} for {sender}'s request "
                f"{request.req} naming epoch {request.epoch}"
            )

    async def stepped_down_after_pause(self, process) -> None:
        """Right after a resume, once every task has had its turn: not active on an old lease."""
        resumed = trio.current_time()
        mine = self.holdings.get(process.name)
        stale = mine is not None and mine.until <= resumed and process.active
        self.seen["holders resumed after their lease"] += stale
        await self.world.settle()
        if stale and process.alive and process.active:
            current = self.holdings.get(process.name)
            if current is mine or current.until <= trio.current_time():
                self.fail(f"{process.name} still active after a pause past its lease")

    # -- outward effects ------------------------------------------------------------

    def fence_checked(self, process, ok: bool) -> None:
        """A plugin asked ``process``'s fence before an outward effect."""
        if not ok:
            return
        now = trio.current_time()
        self.seen["fence said yes"] += 1
        mine = self.holdings.get(process.name)
        if mine is None or mine.until <= now:
            self.fail(f"{process.name}'s fence said yes after its validity ({mine})")
        for name in self._others_valid(process.name, now):
            self.fail(f"{process.name}'s fence said yes while {name} is valid")
        if mine is not None:
            self._tickets[process.name] = Ticket(now, mine.tenure, mine.epoch)

    def sent(self, process) -> Ticket:
        """An effect leaves ``process``; returns the yes it left on."""
        now = trio.current_time()
        self.seen["effects sent"] += 1
        ticket = self._tickets.pop(process.name, None)
        if ticket is None:  # the sender did not ask: what was the fence there for?
            mine = self.holdings.get(process.name)
            unsafe = self._others_valid(process.name, now) or mine is None or mine.until <= now
            if unsafe:
                self.fail(
                    f"{process.name} sent an effect without a yes from its fence, "
                    f"past its validity ({mine}; valid now: {self._others_valid('', now)})"
                )
            return Ticket(now, mine.tenure if mine else -1, mine.epoch if mine else 0)
        if now - ticket.at > COVER:
            self.seen["effects sent late (past the margin's cover)"] += 1
        else:
            for name in self._others_valid(process.name, now):
                self.fail(
                    f"{process.name}'s effect left {now - ticket.at:.6f} s after its fence "
                    f"check, within the margin's cover, while {name} is valid"
                )
        return ticket

    def resource(self, sender: str, effect, accepted: bool) -> None:
        """The fenced resource judged an effect (its epoch rule is the model's)."""
        if not accepted:
            self.seen["stale effects rejected by the resource"] += 1
            return
        self.seen["effects accepted by the resource"] += 1
        newest = self._newest_at_resource
        if newest is not None and effect.tenure < newest.tenure:
            if effect.epoch not in self.forced_epochs:
                self.fail(
                    f"the resource accepted {sender}'s effect of a deposed holding (tenure "
                    f"{effect.tenure}, epoch {effect.epoch}) after tenure {newest.tenure} "
                    f"(epoch {newest.epoch})"
                )
            return
        self._newest_at_resource = Holding(effect.epoch, 0.0, effect.tenure)
