"""The election under seeded faults, many nodes in one trio.run on the mock clock.

CI runs ``RACKBOOT_SIM_SEEDS`` seeds (default 200, about a minute); the long
mode is ``python -m tests.simulation --seeds 5000``. A failure prints the
failing seeds; ``python -m tests.simulation --seed S --trace`` replays one.
"""

from __future__ import annotations

import os

import appliance.ha.acceptor as acceptor_module
import appliance.ha.proposer as proposer_module
from appliance.ha.fence import Fence
from appliance.ha.schema import Timing
from tests.simulation.scenario import MARGIN_BOUND, run_seed, summary

SEEDS = int(os.environ.get("RACKBOOT_SIM_SEEDS", "200"))


def test_every_seed_keeps_the_invariants_and_elects_one_holder_after_healing():
    results = [run_seed(seed) for seed in range(SEEDS)]
    report = summary(results)
    print(report)
    assert all(r.ok for r in results), report
    # the faults reached what the invariants are about
    assert sum(r.failovers for r in results) > SEEDS / 2
    assert sum(r.stale_resumes for r in results) > 0
    assert sum(r.effects for r in results) > SEEDS * 50


def test_a_seed_replays_the_same_run():
    first, again, other = run_seed(7, trace=True), run_seed(7, trace=True), run_seed(8)
    assert first.trace == again.trace and first.digest == again.digest
    assert len(first.trace) > 500
    assert other.digest != first.digest


def test_the_checker_catches_acceptors_that_grant_over_a_live_lease(monkeypatch):
    """Without the 'busy' refusal a higher ballot takes the lease from a live holder."""
    real = acceptor_module.Acceptor._refusal

    def forgetful(self, sender, acceptors, now):
        why, grant = real(self, sender, acceptors, now)
        return ("" if why == "busy" else why), grant

    monkeypatch.setattr(acceptor_module.Acceptor, "_refusal", forgetful)
    result = run_seed(0)
    assert not result.ok
    assert "two holders" in " ".join(result.violations)


def test_the_checker_catches_an_effect_without_the_fence(monkeypatch):
    """A node that acts without asking the fence, woken from a pause past its lease."""
    monkeypatch.setattr(Fence, "ok", lambda self: True)
    caught = [r.seed for r in map(run_seed, range(10)) if not r.ok]
    assert caught, "no seed of 10 caught an effect after validity"


def first_failing(**kwargs) -> int | None:
    return next((s for s in range(SEEDS) if not run_seed(s, **kwargs).ok), None)


def test_the_checker_catches_a_replayed_propose_accepted_again(monkeypatch):
    """The adversary replays captured frames: an acceptor that takes a round's proposal
    again (the old rule) votes twice for one round, and a dead holder's grant lives on."""
    from appliance.ha.messages import Propose

    real = acceptor_module.Acceptor._fresh

    def twice(self, sender, message):
        if isinstance(message, Propose):
            return message.req == self._last_req.get(sender, -1)
        return real(self, sender, message)

    monkeypatch.setattr(acceptor_module.Acceptor, "_fresh", twice)
    assert first_failing() is not None


def test_the_checker_catches_a_margin_of_zero_with_five_percent_drift():
    timing = Timing(lease=1.0, renew=0.25, margin=0.0, max_clock_rate_error=0.05)
    assert first_failing(timing=timing) is not None, f"none of {SEEDS} seeds caught margin 0"


def test_adversarial_timing_keeps_the_invariants():
    """The margin at its legal minimum, every clock at a bound of the allowed rate error,
    and slow queues near the round timeout."""
    results = [run_seed(s, timing=MARGIN_BOUND, extreme_rates=True) for s in range(SEEDS)]
    report = summary(results)
    assert all(r.ok for r in results), report


def test_the_checker_catches_validity_counted_from_the_grant(monkeypatch):
    """The holder's lease must count from the round's start, before it asked: counted from
    the grant, a late answer stretches it past the acceptors' timers."""
    real = proposer_module.Proposer._granted

    def from_grant(self, now):
        if self.round is not None:
            self.round.start = now
        real(self, now)

    monkeypatch.setattr(proposer_module.Proposer, "_granted", from_grant)
    assert first_failing(timing=MARGIN_BOUND, extreme_rates=True) is not None
