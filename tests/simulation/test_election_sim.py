"""Whole racks under seeded faults, many nodes in one trio.run on the mock clock.

Every CI seed set (scenario.py ``SETS``) runs ``RACKBOOT_SIM_SEEDS`` seeds (default
200, 10,000 under ``RACKBOOT_TEST_PROFILE=long``) on every CPU, keeps the invariants
(checker.py) and exercises what it is for (``floors``: a set that never paused a
holder between its fence check and its send proves nothing about that pause). Each
deliberate mutation (mutations.py) must be caught by its set. A failure prints the
failing seeds; ``python -m tests.simulation --set NAME --seed S --trace`` replays one.
"""

from __future__ import annotations

import pytest

from tests.simulation.mutations import MUTATIONS
from tests.simulation.runs import default_seeds, run_seeds
from tests.simulation.scenario import (
    CI_SETS,
    DEFAULT_WEIGHTS,
    SETS,
    SeedSet,
    run_seed,
    summary,
    totals,
)

SEEDS = default_seeds()
SOME = 1 if SEEDS >= 100 else 0  # a floor that a run of a few seeds may miss


def floors(seed_set: SeedSet) -> dict[str, float]:
    """What the set's seeds must have exercised, in all."""
    weights = {**DEFAULT_WEIGHTS, **seed_set.weights}
    need = {
        "failovers": SEEDS / 2,
        "fence said yes": SEEDS * 50,
        "holders resumed after their lease": SOME,
        "pauses at persist": SOME,
        "pauses at checked": SOME,
        "effects sent late (past the margin's cover)": SOME,
        "stale effects rejected by the resource": SOME,
        "hand-overs": SOME,
        "replayed handover": SOME,
        "replayed propose": SOME,
        "replayed release": SOME,
        "operator: demote": SOME,
        "operator: maintenance on": SOME,
        "operator: force": SOME,
    }
    if weights["handover"]:
        need |= {"operator: handover": SEEDS, "graceful hand-overs": SEEDS / 4}
    optional = {
        "lease": "restarts with a shorter lease than before",
        "lower-lease": "lease lowered beside a holder cut off from the rest",
        "amnesia": "amnesia scenarios: holder killed after witnesses restarted",
        "reconfigure": "membership changes",
    }
    need |= {seen: SOME for kind, seen in optional.items() if weights[kind]}
    if seed_set.rates == "slow-holder":
        need["slowest holder, fastest acceptors"] = SEEDS
    if seed_set.late[1]:
        need["grants near the round timeout"] = SEEDS
    if seed_set.replicated:
        need |= {
            "acknowledged writes": SEEDS * 50,
            "divergent tails cut": SOME,
            "snapshots installed": SOME,
            "kills during an fsync": SOME,
            "torn tails cut at start": SOME,
            "standby links silent, dropped": SOME,
            "replication frames refused: old-epoch": SOME,
            "ineligibility declared (kept by an acceptor)": SOME,
            "runs converged": SEEDS,
        }
    return need


@pytest.mark.parametrize("name", CI_SETS)
def test_every_seed_of_the_set_keeps_the_invariants(name):
    results = run_seeds(name, range(SEEDS))
    report = summary(results)
    print(f"{name}: {SETS[name].doc}\n{report}")
    assert all(r.ok for r in results), report
    seen = totals(results)
    missed = {k: (seen.get(k, 0), f) for k, f in floors(SETS[name]).items() if seen.get(k, 0) < f}
    assert not missed, f"not exercised (seen, floor): {missed}"


def test_a_seed_replays_the_same_run():
    first, again, other = (run_seed(s, "slow-holder", trace=True) for s in (7, 7, 8))
    assert first.trace == again.trace and first.digest == again.digest
    assert len(first.trace) > 500
    assert other.digest != first.digest


@pytest.mark.parametrize("name", MUTATIONS)
def test_the_seed_set_catches_the_mutation(name):
    mutation = MUTATIONS[name]
    results = run_seeds(
        mutation.set, range(SEEDS), mutation=name,
        until=lambda r: any(mutation.expect in v for v in r.violations),
    )  # fmt: skip
    caught = [r for r in results if any(mutation.expect in v for v in r.violations)]
    assert caught, f"none of {SEEDS} seeds of {mutation.set} caught: {mutation.doc}"


def test_a_holder_stopped_right_after_its_release_left_is_the_only_holder():
    """A pause between the runner's sends and its events (step ``sent``), as a holder
    releases (demote, maintenance): the other appliance takes over at once."""
    results = run_seeds("pause-after-send", range(SEEDS), until=lambda r: not r.ok)
    assert all(r.ok for r in results), summary(results)


def test_a_rack_whose_appliances_run_different_leases_elects_a_holder():
    """The appliance on the longer lease gets partial grants (its own acceptor, the
    witness), the others refuse it (lease-too-long); if it retries before those grants
    run out, the others are told busy for ever."""
    results = run_seeds("mixed-leases", range(SEEDS), until=lambda r: not r.ok)
    assert all(r.ok for r in results), summary(results)


def test_a_replayed_answer_counts_only_for_the_round_it_answered():
    """A box on the network replays the promises and acceptances one appliance's round got
    to the other appliance, when it asks with the same request id."""
    results = run_seeds("replayed-answers", range(SEEDS), until=lambda r: not r.ok)
    assert all(r.ok for r in results), summary(results)
