"""Deliberate bugs, each put back into the real code (or the model of a plugin's send
path), and the seed set that must catch it with the violation it must cause. A
mutation test passes only if a seed of its set fails that way: the checker is
proven to see what it is for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import appliance.ha.acceptor as acceptor_module
import appliance.ha.election as election_module
import appliance.ha.proposer as proposer_module
import appliance.state.commit as commit_module
import appliance.state.replication as replication_module
import appliance.state.service as service_module
from appliance.ha.fence import Fence
from appliance.ha.messages import Propose, Release
from tests.simulation.world import DriftClock, Process

Patch = Callable[[object, str, object], None]  # (owner, attribute, replacement)


@dataclass(frozen=True)
class Mutation:
    name: str
    doc: str
    set: str  # the seed set that must catch it
    expect: str  # in the violation it must cause
    patch: Callable[[Patch], None] = lambda patch: None
    margin: float | None = None  # every timing's margin replaced (no rule checks it)


def busy_rule_removed(patch: Patch) -> None:
    real = acceptor_module.Acceptor._refusal

    def forgetful(self, sender, acceptors, now):
        why, grant = real(self, sender, acceptors, now)
        return ("" if why == "busy" else why), grant

    patch(acceptor_module.Acceptor, "_refusal", forgetful)


def fence_bypassed(patch: Patch) -> None:
    patch(Fence, "ok", lambda self: True)


def fence_not_checked(patch: Patch) -> None:
    patch(Process, "may_send", lambda self: True)  # the role alone decides


def propose_accepted_twice(patch: Patch) -> None:
    real = acceptor_module.Acceptor._fresh

    def twice(self, sender, message):
        if isinstance(message, Propose):  # the old rule: any propose of the promised round
            return message.req == self._last_req.get(sender, -1)
        return real(self, sender, message)

    patch(acceptor_module.Acceptor, "_fresh", twice)


def validity_from_the_grant(patch: Patch) -> None:
    real = proposer_module.Proposer._granted

    def from_grant(self, now):
        if self.round is not None:
            self.round.start = now
        real(self, now)

    patch(proposer_module.Proposer, "_granted", from_grant)


def membership_by_count(patch: Patch) -> None:
    """The digest ignored everywhere (acceptors, proposers, the election's confirmation)."""
    patch(election_module.Election, "_judge", lambda self, now: None)
    patch(acceptor_module.Acceptor, "digest", lambda self, grant: "")
    real = proposer_module.Proposer.receive

    def counting(self, sender, message, now):
        if hasattr(message, "members"):
            message = dataclasses.replace(message, members=self.members.digest)
        real(self, sender, message, now)

    patch(proposer_module.Proposer, "receive", counting)


def restart_wait_from_the_new_lease(patch: Patch) -> None:
    """The acceptor waits only its new lease after a restart, whatever it granted before."""
    real = acceptor_module.Acceptor.__init__

    def forgetting(self, *args, restart_wait=0.0, **kwargs):
        real(self, *args, **kwargs)

    patch(acceptor_module.Acceptor, "__init__", forgetting)


def force_stays_armed(patch: Patch) -> None:
    """The old rule: a forced promote stays armed until this node is granted a lease."""
    Proposer = proposer_module.Proposer
    promote, start, granted = Proposer.promote, Proposer._start, Proposer._granted

    def armed_promote(self, now, *, force=False):
        promote(self, now, force=force)
        self.force_epoch = self.force_epoch or force

    def armed_start(self, now):
        armed = self.force_epoch
        start(self, now)
        self.force_epoch = armed

    def disarmed_on_grant(self, now):
        granted(self, now)
        if self.valid_until is not None:
            self.force_epoch = False

    patch(Proposer, "promote", armed_promote)
    patch(Proposer, "_start", armed_start)
    patch(Proposer, "_granted", disarmed_on_grant)


def handover_replayed(patch: Patch) -> None:
    """The old rule: any hand-over from a peer moves a live lease (no request id, no epoch)."""

    def moved(self, sender, message, now):
        if sender in self.members.peers and self.holding(now):
            self.holdoff_until = now + proposer_module.HOLDOFF_LEASES * self.timing.lease
            self._release(now, "handover")

    patch(proposer_module.Proposer, "_handover", moved)


def handover_keeps_serving(patch: Patch) -> None:
    """The old holder sends its hand-over's release but keeps its lease (and fence)."""
    real = proposer_module.Proposer._release

    def keeps(self, now, reason, to=""):
        if reason != "handover":
            return real(self, now, reason, to)
        self.outbox.append((proposer_module.ALL, Release(
            self.group, self._next_req(), self.epoch, stated=True, to=to)))  # fmt: skip

    patch(proposer_module.Proposer, "_release", keeps)


def ineligibility_forgotten(patch: Patch) -> None:
    """The old rules: a node that does not lead wants nobody declared, and a new holder's
    first proposal declares only whom it finds lagging (promises name nobody)."""
    lagging = commit_module.CommitRule.lagging

    def forgetting(self, now, *, leading, **kwargs):
        return lagging(self, now, leading=leading, **kwargs) if leading else frozenset()

    real_prepare = acceptor_module.Acceptor._prepare

    def silent(self, sender, message, now):
        return dataclasses.replace(real_prepare(self, sender, message, now), ineligible=[])

    def wish(self, appliances, now):
        wanted = frozenset(appliances) & frozenset(self.members.peers)
        proposer = self.proposer
        if wanted == proposer.wanted_ineligible:
            return False
        proposer.wanted_ineligible = wanted
        if proposer.holding(now) and proposer.round is None:
            proposer.next_round = min(proposer.next_round, now)
            return True
        return False

    patch(commit_module.CommitRule, "lagging", forgetting)
    patch(acceptor_module.Acceptor, "_prepare", silent)
    patch(election_module.Election, "set_ineligible", wish)


def epoch_floor_at_hello(patch: Patch) -> None:
    """The old rule: a standby's floor for frame epochs is taken once, at hello."""
    patch(replication_module.FollowerStream, "saw_epoch", lambda self, epoch: None)


def follower_waits_for_ever(patch: Patch) -> None:
    """The old rule: a standby waits for ever on a link nothing comes from."""
    patch(service_module, "FOLLOWER_TIMEOUT", math.inf)


def deadline_rounded_to_nearest(patch: Patch) -> None:
    # What the simulation did until its clocks rounded up: a node's deadline could wake its
    # task one ulp before the node's clock reached it, and the task spun at a stopped clock.
    patch(DriftClock, "to_trio", lambda self, local: (local - self.offset) / self.rate)


MUTATIONS = {
    m.name: m
    for m in (
        Mutation("busy-rule-removed", "an acceptor grants over a live lease", "default",
                 "two holders", busy_rule_removed),
        Mutation("fence-bypassed", "the fence says yes after validity", "default",
                 "fence said yes", fence_bypassed),
        Mutation("fence-not-checked", "a plugin sends on its role, not asking the fence",
                 "default", "without a yes from its fence", fence_not_checked),
        Mutation("propose-accepted-twice", "a replayed Propose is accepted again", "default",
                 "twice", propose_accepted_twice),
        Mutation("margin-zero", "margin 0 with 5 % drift", "slow-holder", "two holders",
                 margin=0.0),
        Mutation("validity-from-the-grant", "the holder counts its lease from the grant, "
                 "not the round's start", "late-answers", "two holders", validity_from_the_grant),
        Mutation("membership-by-count", "membership compared by the number of acceptors",
                 "membership", "two holders", membership_by_count),
        Mutation("restart-wait-from-the-new-lease", "lease lowered and restarted: the restart "
                 "wait uses the new lease", "default", "two holders",
                 restart_wait_from_the_new_lease),
        Mutation("force-stays-armed", "a forced promote that fails stays armed for a later "
                 "round", "default", "epoch did not rise", force_stays_armed),
        Mutation("handover-replayed", "a replayed hand-over moves the lease again", "default",
                 "handed over", handover_replayed),
        Mutation("handover-keeps-serving", "the old holder keeps its lease after releasing "
                 "it to the successor of a graceful hand-over", "handover", "two holders",
                 handover_keeps_serving),
        Mutation("ineligibility-forgotten", "a new holder clears whom the previous one "
                 "declared ineligible", "replication", "(a)", ineligibility_forgotten),
        Mutation("epoch-floor-at-hello", "a standby takes its floor for frame epochs once, "
                 "at hello", "replication", "(c)", epoch_floor_at_hello),
        Mutation("follower-waits-for-ever", "a standby follows a silent link for ever",
                 "replication", "(e)", follower_waits_for_ever),
        Mutation("deadline-rounded-to-nearest", "a node's deadline maps to the nearest "
                 "instant, maybe one ulp before its clock reads it", "replication",
                 "livelock", deadline_rounded_to_nearest),
    )
}  # fmt: skip


@contextlib.contextmanager
def applied(mutation: Mutation | None):
    with contextlib.ExitStack() as stack:
        if mutation is not None:
            mutation.patch(lambda owner, name, value: stack.enter_context(
                mock.patch.object(owner, name, value)))  # fmt: skip
        yield
