"""The acceptor's rules with explicit time: restart wait, live leases, ballots, epochs."""

from __future__ import annotations

from appliance.ha.acceptor import Acceptor
from appliance.ha.election import AcceptorSet
from appliance.ha.membership import Members
from appliance.ha.messages import Prepare, Propose, Release

A, B, W = "a" * 16, "b" * 16, "c" * 16
MEMBERS = Members.of(A, [B], [W])
D, APPL = MEMBERS.digest, sorted(MEMBERS.appliances)


def ready(known_epoch=0, now=0.0):
    acceptor = Acceptor("rack1", now, max_lease=1.0, known_epoch=known_epoch, members=MEMBERS)
    return acceptor, now + 1.0


def grant(acceptor, who, now, *, ballot=1, epoch=1, req=1):
    assert acceptor.handle(who, Prepare("rack1", req, ballot, D, APPL), now).ok
    return acceptor.handle(who, Propose("rack1", req, ballot, epoch, 1.0, D, APPL), now)


def test_after_a_restart_it_votes_for_nobody_for_one_lease_period():
    acceptor, t = ready()
    early = acceptor.handle(A, Prepare("rack1", 1, 1, D, APPL), t - 0.01)
    assert (early.ok, early.why) == (False, "restarting")
    assert abs(early.left - 0.01) < 1e-9
    assert not acceptor.handle(A, Propose("rack1", 1, 1, 1, 1.0, D, APPL), t - 0.01).ok
    assert acceptor.handle(A, Prepare("rack1", 2, 1, D, APPL), t).ok


def test_a_live_lease_refuses_every_other_owner_until_it_runs_out():
    acceptor, t = ready()
    assert grant(acceptor, A, t).ok
    other = acceptor.handle(B, Prepare("rack1", 5, 99, D, APPL), t + 0.5)
    assert (other.ok, other.why, other.owner, other.owner_epoch) == (False, "busy", A, 1)
    assert abs(other.left - 0.5) < 1e-9
    assert not acceptor.handle(B, Propose("rack1", 5, 99, 2, 1.0, D, APPL), t + 0.999).ok
    # the owner renews at any time; the others get their turn once it runs out
    assert grant(acceptor, A, t + 0.25, ballot=2, req=2).left == 1.0
    assert acceptor.handle(B, Prepare("rack1", 6, 99, D, APPL), t + 1.249).why == "busy"
    assert grant(acceptor, B, t + 1.25, ballot=99, epoch=2, req=7).ok


def test_a_lower_ballot_is_outbid_and_told_the_promise():
    acceptor, t = ready()
    assert acceptor.handle(B, Prepare("rack1", 1, 7, D, APPL), t).ok
    refused = acceptor.handle(A, Prepare("rack1", 2, 6, D, APPL), t)
    assert (refused.ok, refused.why, refused.promised_n, refused.promised_by) == (
        False,
        "outbid",
        7,
        B,
    )
    assert acceptor.handle(B, Propose("rack1", 1, 7, 1, 1.0, D, APPL), t).ok
    assert acceptor.handle(A, Propose("rack1", 2, 6, 1, 1.0, D, APPL), t + 2).why == "outbid"


def test_an_epoch_below_the_highest_accepted_is_refused():
    acceptor, t = ready(known_epoch=9)
    assert grant(acceptor, A, t, epoch=8).why == "stale-epoch"
    assert grant(acceptor, A, t, ballot=2, epoch=9, req=2).ok


def test_a_lease_longer_than_its_own_is_refused():
    acceptor, t = ready()
    acceptor.handle(A, Prepare("rack1", 1, 1, D, APPL), t)
    assert acceptor.handle(A, Propose("rack1", 1, 1, 1, 1.5, D, APPL), t).why == "lease-too-long"


def test_a_proposer_counting_other_acceptors_is_refused():
    acceptor, t = ready()
    other = Members.of(A, [B], ["d" * 16])  # the same count, another witness
    assert acceptor.handle(A, Prepare("rack1", 1, 1, other.digest, APPL), t).why == "mismatch"
    assert acceptor.refusals == {"mismatch": 1} and acceptor.mismatched == {A: other.digest}
    stranger = "e" * 16  # a member of the cluster, but not an appliance of this rack
    refused = acceptor.handle(stranger, Prepare("rack1", 1, 1, D, [*APPL, stranger]), t)
    assert refused.why == "stranger"


def test_a_disk_acceptor_asks_to_persist_each_new_epoch_once():
    acceptor, t = ready(known_epoch=3)
    grant(acceptor, A, t, epoch=4)
    assert acceptor.persist == 4
    acceptor.persist = None
    grant(acceptor, A, t + 0.2, ballot=2, epoch=4, req=2)
    assert acceptor.persist is None


def test_a_diskless_acceptor_is_amnesic_until_it_accepts_a_proposal():
    acceptor = Acceptor("rack1", 0.0, max_lease=1.0, known_epoch=None)
    assert acceptor.handle(A, Prepare("rack1", 1, 1, D, APPL), 1.0).amnesic
    acceptor.handle(A, Propose("rack1", 1, 1, 12, 1.0, D, APPL), 1.0)
    assert acceptor.persist is None  # nowhere to persist it
    after = acceptor.handle(A, Prepare("rack1", 2, 2, D, APPL), 1.1)
    assert (after.amnesic, after.known_epoch) == (False, 12)


def test_only_the_owner_releases_and_only_its_current_epoch():
    acceptor, t = ready()
    grant(acceptor, A, t, epoch=3)
    acceptor.handle(B, Release("rack1", 9, 3), t)
    acceptor.handle(A, Release("rack1", 9, 2), t)
    assert acceptor.live_grant(t) is not None
    acceptor.handle(A, Release("rack1", 9, 3), t)  # the id of the last release: a replay
    assert acceptor.live_grant(t) is not None and acceptor.ignored == {"release": 1}
    acceptor.handle(A, Release("rack1", 10, 3), t)
    assert acceptor.live_grant(t) is None


def test_a_witness_keeps_one_acceptor_per_rack_and_a_bounded_number_of_racks():
    witness = AcceptorSet(1.0, 0.0, max_groups=2)
    assert witness.receive(A, Prepare("rack1", 1, 1, D, APPL), 0.5).why == "restarting"
    # a rack first heard after the restart wait is not made to wait again
    assert witness.receive(A, Prepare("rack2", 1, 1, D, APPL), 1.0).ok
    assert witness.receive(A, Prepare("rack3", 1, 1, D, APPL), 1.0) is None
    assert witness.refused_groups == 1
    assert set(witness.status(1.0)) == {"rack1", "rack2"}


def test_a_replayed_propose_is_taken_once_and_never_renews_a_dead_holders_grant():
    """Replaying one captured Propose kept a rack without a holder long after it died."""
    acceptor, t = ready()
    assert grant(acceptor, A, t, req=5).ok
    replay = Propose("rack1", 5, 1, 1, 1.0, D, APPL)
    for k in range(1, 20):  # every 0.5 s for 10 s after the holder died
        assert acceptor.handle(A, replay, t + 0.5 * k) is None
    assert acceptor.live_grant(t + 1.0) is None
    assert grant(acceptor, B, t + 1.0, ballot=2, epoch=2, req=1).ok
    assert acceptor.ignored["propose"] == 19


def test_a_replayed_prepare_and_a_propose_without_its_promise_are_not_answered():
    acceptor, t = ready()
    assert grant(acceptor, A, t, req=5).ok
    assert acceptor.handle(A, Prepare("rack1", 5, 1, D, APPL), t + 2) is None  # an old id
    assert acceptor.handle(A, Prepare("rack1", 4, 9, D, APPL), t + 2) is None  # older still
    # a proposal for a round this acceptor never promised (its prepare was lost)
    assert acceptor.handle(B, Propose("rack1", 1, 7, 2, 1.0, D, APPL), t + 2) is None
    # a proposal for a ballot other than the one promised to that sender in that round
    assert acceptor.handle(B, Prepare("rack1", 2, 7, D, APPL), t + 2).ok
    assert acceptor.handle(B, Propose("rack1", 2, 8, 2, 1.0, D, APPL), t + 2).why == "outbid"


def test_the_restart_wait_covers_the_longest_lease_of_an_earlier_life():
    """Lowering [ha] lease and restarting gave two holders: the wait used the new lease."""
    acceptor = Acceptor(
        "rack1", 0.0, max_lease=1.0, known_epoch=0, members=MEMBERS, restart_wait=3.0
    )
    assert acceptor.handle(A, Prepare("rack1", 1, 1, D, APPL), 2.9).why == "restarting"
    assert acceptor.handle(A, Prepare("rack1", 2, 1, D, APPL), 3.0).ok
