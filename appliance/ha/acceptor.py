"""One acceptor of the PaxosLease-style election (sans-IO).

Rules, in the order they are applied to a request from node ``sender``:

0. **Fresh requests only.** Request ids rise per sender, across the sender's
   restarts too (its boot count is their high half), so a prepare or release
   whose id is not above the last one seen from that sender, and a propose
   that is not for exactly the round this acceptor last promised that sender,
   or that it already accepted, is a duplicate or a replay: counted, not
   answered. A replayed frame can then at most be taken once per restart of
   this acceptor (which votes for nobody for a lease period first).
1. **Restart wait.** For one lease period after it starts, an acceptor votes
   for nobody: a grant its previous life made may still be running, and it
   remembers none (only the epoch is kept on disk). The period is the longest
   lease it may have granted in any earlier life (kept on disk too), so
   lowering ``lease`` and restarting never shortens the wait.
1b. **Membership.** An appliance's acceptor answers only the rack's
   appliances (``stranger`` otherwise) and only proposers whose membership
   digest is its own (``mismatch``): see :mod:`appliance.ha.membership`. A
   witness knows no configuration: it refuses a digest other than the one
   the live grant was made under.
2. **Live lease.** While a lease it granted is running, it refuses every
   other owner (``busy``, with how long is left), so the owner alone can
   renew it and nobody else duels with it.
3. **Ballots.** Paxos' rule: a prepare promises not to accept lower ballots;
   a proposal below the promise is refused (``outbid``).
4. **Epochs.** A proposal below the highest epoch this acceptor accepted is
   refused (``stale-epoch``); a higher one is remembered and, on a node with
   a disk, made durable *before* the answer leaves (:attr:`persist`).
5. **Eligibility.** The holder's proposals name the appliances it declared
   ineligible (a standby that stopped acknowledging the state log); the set of
   the last proposal accepted is kept (on disk too, before the answer leaves:
   :attr:`persist_ineligible`), and those appliances are refused
   (``ineligible``) unless an operator forces the round. A standby that may
   lack acknowledged records is thus never elected by itself.

A diskless acceptor (the witness) starts **amnesic**: it says so in its
promises, and proposers do not let it vouch for the newest epoch (see
:mod:`appliance.ha.proposer`). It stops being amnesic when it accepts a
proposal: that proposal's epoch was proven newest by a majority that
remembers, or is a live holder's renewal, so from then on it knows.

Time is the acceptor's own monotonic clock; messages carry durations only.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.ha.membership import Members
from appliance.ha.messages import Accepted, Message, Prepare, Promise, Propose, Release

MAX_SENDERS = 64  # request ids remembered (a rack's appliances, a witness's racks' ones)


@dataclass
class Grant:
    owner: str
    epoch: int
    expires: float  # on this acceptor's clock
    members: str = ""  # the membership digest it was granted under


class Acceptor:
    def __init__(
        self,
        group: str,
        now: float,
        *,
        max_lease: float,
        known_epoch: int | None,
        members: Members | None = None,
        restart_wait: float = 0.0,
        ineligible: frozenset[str] = frozenset(),
    ) -> None:
        """``known_epoch``: from disk, or None for a diskless acceptor (it starts amnesic).
        ``members``: the rack's membership (None: a witness, which has none).
        ``restart_wait``: the longest lease an earlier life may have granted (from disk)."""
        self.group = group
        self.max_lease = max_lease
        self.members = members
        self.restart_wait = max(max_lease, restart_wait)
        self.ready_at = now + self.restart_wait
        self.diskless = known_epoch is None
        self.known_epoch = known_epoch or 0
        self.amnesic = known_epoch is None
        self.promised: tuple[int, str] = (0, "")
        self.grant: Grant | None = None
        self.persist: int | None = None  # an epoch to make durable before sending the answer
        self.ineligible = ineligible  # from the last proposal accepted (kept on disk)
        self.persist_ineligible: frozenset[str] | None = None  # likewise, before the answer
        self.refusals: dict[str, int] = {}
        self.ignored: dict[str, int] = {}  # duplicates and replays, never answered
        self._last_req: dict[str, int] = {}  # sender -> its newest request id
        self._accepted: tuple[str, int] | None = None  # (sender, req) of the last acceptance
        self.mismatched: dict[str, str] = {}  # sender -> the other digest it sent

    def live_grant(self, now: float) -> Grant | None:
        if self.grant is not None and now >= self.grant.expires:
            self.grant = None
        return self.grant

    def handle(self, sender: str, message: Message, now: float) -> Message | None:
        """One request in, at most one answer out (to ``sender``)."""
        if not self._fresh(sender, message):
            self.ignored[message.TYPE] = self.ignored.get(message.TYPE, 0) + 1
            return None
        if isinstance(message, Prepare):
            return self._prepare(sender, message, now)
        if isinstance(message, Propose):
            return self._propose(sender, message, now)
        if isinstance(message, Release):
            grant = self.live_grant(now)
            if grant is not None and grant.owner == sender and grant.epoch == message.epoch:
                self.grant = None
                if message.stated:
                    self._adopt_ineligible(frozenset(message.ineligible) - {sender})
        return None

    def _adopt_ineligible(self, ineligible: frozenset[str]) -> None:
        if ineligible != self.ineligible:
            self.ineligible = ineligible
            if not self.diskless:
                self.persist_ineligible = ineligible

    def _fresh(self, sender: str, message: Message) -> bool:
        last = self._last_req.get(sender, -1)
        if isinstance(message, Propose):
            # the phase 2 of the round last prepared by this sender, accepted at most once
            return message.req == last and self._accepted != (sender, message.req)
        if message.req <= last:
            return False
        if sender not in self._last_req and len(self._last_req) >= MAX_SENDERS:
            self._last_req.pop(next(iter(self._last_req)))  # the oldest sender seen
        self._last_req[sender] = message.req
        return True

    def _refusal(self, sender: str, m: Prepare | Propose, now: float) -> tuple[str, Grant | None]:
        grant = self.live_grant(now)
        if sender not in (self.members.appliances if self.members else m.appliances):
            why = "stranger"
        elif now < self.ready_at:
            why = "restarting"
        elif self.digest(grant) not in ("", m.members):
            why = "mismatch"
            if len(self.mismatched) < MAX_SENDERS or sender in self.mismatched:
                self.mismatched[sender] = m.members
        elif grant is not None and grant.owner != sender:
            why = "busy"
        elif sender in self.ineligible and not m.force:
            why = "ineligible"
        else:
            return "", grant
        return self._count(why), grant

    def digest(self, grant: Grant | None) -> str:
        """The membership digest requests must carry: ours, or for a witness the live grant's."""
        if self.members is not None:
            return self.members.digest
        return grant.members if grant is not None else ""

    def _count(self, why: str) -> str:
        self.refusals[why] = self.refusals.get(why, 0) + 1
        return why

    def _prepare(self, sender: str, m: Prepare, now: float) -> Promise:
        why, grant = self._refusal(sender, m, now)
        ballot = (m.ballot, sender)
        if not why and ballot < self.promised:
            why = self._count("outbid")
        if not why:
            self.promised = ballot
        return Promise(
            self.group, m.req, m.ballot, not why, why,
            owner=grant.owner if grant else "", owner_epoch=grant.epoch if grant else 0,
            left=self._left(grant, now), known_epoch=self.known_epoch, amnesic=self.amnesic,
            promised_n=self.promised[0], promised_by=self.promised[1],
            members=self._judged_by(m, grant), ineligible=sorted(self.ineligible),
        )  # fmt: skip

    def _judged_by(self, m: Prepare | Propose, grant: Grant | None) -> str:
        return self.digest(grant) or m.members

    def _propose(self, sender: str, m: Propose, now: float) -> Accepted:
        why, grant = self._refusal(sender, m, now)
        ballot = (m.ballot, sender)
        if not why and ballot != self.promised:
            why = self._count("outbid")  # Paxos: accept only the ballot promised last
        if not why and m.epoch < self.known_epoch:
            why = self._count("stale-epoch")
        if not why and m.lease > self.max_lease:
            why = self._count("lease-too-long")
        if not why:
            self._accepted = (sender, m.req)
            self.grant = grant = Grant(sender, m.epoch, now + m.lease, m.members)
            self.amnesic = False
            self._adopt_ineligible(frozenset(m.ineligible) - {sender})
            if m.epoch > self.known_epoch:
                self.known_epoch = m.epoch
                if not self.diskless:
                    self.persist = m.epoch
        return Accepted(
            self.group, m.req, m.ballot, not why, why,
            owner=grant.owner if grant else "", left=self._left(grant, now),
            known_epoch=self.known_epoch, promised_n=self.promised[0],
            promised_by=self.promised[1], members=self._judged_by(m, grant),
        )  # fmt: skip

    def _left(self, grant: Grant | None, now: float) -> float:
        if now < self.ready_at:
            return min(self.ready_at - now, 3600.0)
        return max(0.0, min(grant.expires - now, 3600.0)) if grant else 0.0

    def status(self, now: float) -> dict:
        grant = self.live_grant(now)
        return {
            "ready": now >= self.ready_at,
            "restart_wait": self.restart_wait,
            "known_epoch": self.known_epoch,
            "amnesic": self.amnesic,
            "granted_to": grant.owner if grant else "",
            "grant_left": round(grant.expires - now, 3) if grant else 0.0,
            "refusals": dict(self.refusals),
            "ignored": dict(self.ignored),
            "mismatched": dict(self.mismatched),
        }
