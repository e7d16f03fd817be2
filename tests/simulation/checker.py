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

import bisect
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
        self.state = StateChecker(self)

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


# -- the replicated state log --------------------------------------------------------------


def epoch_in(history: list[tuple[int, int]], last: int, lsn: int) -> int | None:
    """The epoch of record ``lsn`` by an epoch history ``[(epoch, first lsn), ...]`` of a
    log that ends at ``last`` (None: not in it, or older than the history)."""
    if not 0 < lsn <= last or not history:
        return None
    n = bisect.bisect_right(history, lsn, key=lambda entry: entry[1]) - 1
    return history[n][0] if n >= 0 else None


def store_epoch(store, lsn: int) -> int | None:
    """The epoch of record ``lsn`` in a store's memory: committed, or appended."""
    tables = store.tables
    if lsn <= tables.lsn:
        return epoch_in(tables.history.entries, tables.lsn, lsn)
    n = lsn - tables.lsn - 1
    return store.uncommitted[n][0].epoch if n < len(store.uncommitted) else None


def durable_epoch(process, lsn: int) -> int | None:
    """The epoch of record ``lsn`` in what a restart of ``process`` would read back."""
    tables = process.statelog.durable_recovery().tables
    return epoch_in(tables.history.entries, tables.lsn, lsn)


class StateChecker:
    """The state log's invariants (tests/simulation/replicas.py runs it), checked as things
    happen. A write is **acknowledged** when its leader's ``on_commit`` gets a position;
    the records it commits with it (every record up to its LSN in that leader's log) are
    **committed**: the cluster's history, one record per LSN.

    * (a) when a node is granted a new epoch (Acquired), every acknowledged write is durable
      in its log (what a restart would read back) and in its memory; a forced promote may
      lose some (docs/state.md): counted, and the history is rebased on the forced node's;
    * (b) no two different records are committed at one LSN: a leader commits the records
      the history has; a node that applies a record at a committed LSN applies that one
      (except a deposed leader applying its own records, kept until they are cut); a cut
      never removes a committed record;
    * (c) the fencing token at the receiver: a standby never accepts records (or a
      snapshot) sent under an epoch lower than the highest it knows, its election's
      durable epoch or the epoch of a frame it accepted before in this life;
    * (d) no address is given to two clients: an acknowledged allocation never follows,
      in the history, another client's acknowledged allocation of the same address with no
      committed write of it in between;
    * (e) after healing, every appliance's log (in memory and what a restart would read
      back) ends as the holder's, with the same tables, and counts for its commits.
    """

    def __init__(self, checker: Checker) -> None:
        self.checker = checker
        self.world = checker.world
        self.seen = checker.seen
        self.written: dict[tuple[int, int], object] = {}  # (epoch, lsn) -> record appended
        self.acked: dict[int, int] = {}  # lsn -> epoch of acknowledged writes
        self.committed: dict[int, int] = {}  # lsn -> epoch: the history, 1..upto
        self.upto = 0
        self.last_write: dict[str, tuple[int, object, bool]] = {}  # key -> (lsn, record, acked)
        self.highest_frame: dict[tuple[str, int], int] = {}

    def fail(self, text: str) -> None:
        self.checker.fail(text)

    # -- writes ---------------------------------------------------------------------

    def appended(self, process, record) -> None:
        self.written[(record.epoch, record.lsn)] = record
        self.seen["writes appended"] += 1

    def acknowledged(self, process, record, client: str) -> None:
        self.seen["acknowledged writes"] += 1
        store = process.state.store
        if record.lsn <= self.upto:
            if self.committed[record.lsn] != record.epoch:
                self.fail(
                    f"(b) {process.name} acknowledged record {record.lsn} of epoch "
                    f"{record.epoch}: the one committed there is of epoch "
                    f"{self.committed[record.lsn]}"
                )
            return
        tables = store.tables
        for lsn in range(self.upto + 1, record.lsn + 1):
            epoch = epoch_in(tables.history.entries, tables.lsn, lsn)
            if epoch is None:
                self.fail(f"(b) {process.name} committed {record.lsn} without record {lsn}")
                return
            self.committed[lsn] = epoch
            self.upto = lsn
            self._history(self.written.get((epoch, lsn)), lsn, lsn == record.lsn, client)
        self.acked[record.lsn] = record.epoch
        self.world.clients.acknowledged(record, client)

    def _history(self, record, lsn: int, acked: bool, client: str) -> None:
        """(d), one committed record after the other."""
        if record is None:
            return
        previous = self.last_write.get(record.key)
        if acked and record.value is not None and previous is not None:
            at, earlier, was_acked = previous
            if was_acked and earlier.value not in (None, record.value):
                self.fail(
                    f"(d) address {record.key} given to {record.value} (record {lsn}) while "
                    f"{earlier.value} holds it (acknowledged record {at})"
                )
        self.last_write[record.key] = (lsn, record, acked)

    # -- failovers ------------------------------------------------------------------

    def acquired(self, process, epoch: int, forced: bool) -> None:
        """(a), at the moment ``process`` is granted ``epoch``."""
        store = process.state.store
        self.seen["acquisitions with the log checked"] += 1
        others = [p for p in self.world.processes.values() if p is not process and p.state]
        if any(any(ours for _, _, ours in p.state.store.uncommitted) for p in others):
            self.seen["failovers with writes pending on another appliance"] += 1
        durable = process.statelog.durable_recovery().tables
        history, last = durable.history.entries, durable.lsn
        missing = [
            (lsn, epoch_)
            for lsn, epoch_ in self.acked.items()
            if epoch_in(history, last, lsn) != epoch_ or store_epoch(store, lsn) != epoch_
        ]
        if not missing:
            return
        if forced:
            self.seen["acknowledged writes lost to a forced promote"] += len(missing)
            self._rebase(process)
            return
        lsn, epoch_ = missing[0]
        self.fail(
            f"(a) {process.name} acquired epoch {epoch} without {len(missing)} acknowledged "
            f"writes, the first record {lsn} of epoch {epoch_} (its durable log has "
            f"{epoch_in(history, last, lsn)}, its memory {store_epoch(store, lsn)})"
        )
        self._rebase(process)  # one report, not one per later failover

    def _rebase(self, process) -> None:
        """The history becomes the part ``process``'s log shares with it."""
        store = process.state.store
        keep = 0
        while keep < self.upto and store_epoch(store, keep + 1) == self.committed[keep + 1]:
            keep += 1
        for lsn in range(keep + 1, self.upto + 1):
            del self.committed[lsn]
            self.acked.pop(lsn, None)
        self.upto = keep
        for key, (lsn, _, _) in list(self.last_write.items()):
            if lsn > keep:
                del self.last_write[key]

    # -- what each node applies and accepts -----------------------------------------

    def applied(self, process, records: list, leading: bool) -> None:
        """``process``'s store committed ``records`` (record, appended there as leader)."""
        sent_under = process.state.sent_under
        for record, ours in records:
            frame = None if ours else sent_under.pop(record.lsn, None)
            committed = self.committed.get(record.lsn)
            if committed is None or committed == record.epoch:
                continue
            if ours and not leading:
                self.seen["a deposed leader's own records applied (cut later)"] += 1
                continue
            if not ours and not leading and frame is not None and frame < committed:
                # A deposed leader's late frame, before this standby heard of its successor:
                # as if sent in time (the fencing token promises no more; (c) checks it).
                self.seen["a deposed leader's late records applied by a standby (cut later)"] += 1
                continue
            self.fail(
                f"(b) {process.name} applied record {record.lsn} of epoch {record.epoch} "
                f"({'leading' if leading else f'following, sent under epoch {frame}'}): the "
                f"one committed there is of epoch {committed}"
            )

    def accepted(self, process, frame_epoch: int | None) -> None:
        """(c): ``process`` accepts records or a snapshot from a frame of ``frame_epoch``."""
        key = (process.name, process.incarnation)
        highest = max(process.disk.epoch, self.highest_frame.get(key, 0))
        if frame_epoch is None or frame_epoch < highest:
            self.fail(
                f"(c) {process.name} accepted records sent under epoch {frame_epoch} while "
                f"it knew epoch {highest}"
            )
            return
        self.highest_frame[key] = frame_epoch

    def cutting(self, process, after: int) -> None:
        """A standby cuts its log after ``after``: nothing committed may go."""
        store = process.state.store
        for lsn in range(after + 1, min(store.last(), self.upto) + 1):
            if store_epoch(store, lsn) == self.committed[lsn]:
                self.fail(f"(b) {process.name} cuts committed record {lsn} (after {after})")
                return

    def loaded(self, process) -> None:
        self.seen["state logs read back at start"] += 1
        if process.statelog.torn:
            self.seen["torn tails cut at start"] += process.statelog.torn
            process.statelog.torn = 0

    # -- the end ----------------------------------------------------------------------

    def converged(self) -> None:
        """(e), at the end of a run whose last seconds were healed and quiet."""
        world = self.world
        holders = world.holders()
        if len(holders) != 1:
            return  # reported already
        holder = world.processes[holders[0]]
        store = holder.state.store
        if store.uncommitted:
            self.fail(f"(e) the holder {holder.name} has {len(store.uncommitted)} records "
                      "not committed after healing")  # fmt: skip
        skipped = holder.state.replication._skipped()
        for name in world.names:
            process = world.processes[name]
            state = process.state
            if state is None:
                self.fail(f"(e) {name} is not running after healing")
                continue
            durable = process.statelog.durable_recovery().tables
            mine = state.store.tables
            for what, tables in (("memory", mine), ("durable log", durable)):
                if (tables.lsn, tables.epoch, tables.data) != (
                    store.tables.lsn, store.tables.epoch, store.tables.data,
                ):  # fmt: skip
                    self.fail(
                        f"(e) {name}'s {what} ends at record {tables.lsn} of epoch "
                        f"{tables.epoch}, the holder {holder.name}'s at {store.tables.lsn} of "
                        f"epoch {store.tables.epoch}"
                        + ("" if tables.lsn != store.tables.lsn else " (other content)")
                    )
            if name in skipped:
                self.fail(f"(e) {name} is still declared ineligible after healing")
        self.seen["runs converged"] += not any("(e)" in v for v in self.checker.violations)
