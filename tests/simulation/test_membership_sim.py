"""Racks whose appliances' memberships change between restarts (a witness swapped on one
appliance at a time, half the racks misconfigured from the start), with partitions and
hand-overs: the invariants hold, and a membership checked by count is caught."""

from __future__ import annotations

import dataclasses

import appliance.ha.acceptor as acceptor_module
import appliance.ha.election as election_module
import appliance.ha.proposer as proposer_module
from tests.simulation.scenario import run_seed, summary
from tests.simulation.test_election_sim import SEEDS


def test_changing_memberships_keep_the_invariants():
    results = [run_seed(seed, reconfigure=True) for seed in range(SEEDS)]
    report = summary(results)
    print(report)
    assert all(r.ok for r in results), report
    assert sum(r.failovers for r in results) > SEEDS / 2


def test_the_simulation_catches_a_membership_checked_by_count(monkeypatch):
    """The digest ignored everywhere (acceptors, proposers, the election's confirmation):
    only the number of acceptors would be compared, as before."""
    monkeypatch.setattr(election_module.Election, "_judge", lambda self, now: None)
    monkeypatch.setattr(acceptor_module.Acceptor, "digest", lambda self, grant: "")
    real = proposer_module.Proposer.receive

    def counting(self, sender, message, now):
        if hasattr(message, "members"):
            message = dataclasses.replace(message, members=self.members.digest)
        real(self, sender, message, now)

    monkeypatch.setattr(proposer_module.Proposer, "receive", counting)
    caught = next((s for s in range(SEEDS) if not run_seed(s, reconfigure=True).ok), None)
    assert caught is not None, f"none of {SEEDS} seeds caught a membership checked by count"
