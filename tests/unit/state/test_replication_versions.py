"""Versions on the replication stream (appliance/compat.py): what each end states, the
older peer that states nothing, and the refusals that keep an older appliance from
misreading a newer log."""

from __future__ import annotations

import pytest

from appliance.compat import THIS, Range, Speaks
from appliance.state.records import EpochHistory
from appliance.state.replication import FollowerStream, LeaderStream
from appliance.state.signing import Refused
from tests.unit.state.test_replication import MemorySource, log_of, run


def speaks(version="2.0", replication=(1, 2), log=(1, 1), writes=1) -> Speaks:
    return Speaks(version, cluster=Range(1, 2), election=Range(1, 1),
                  replication=Range(*replication), log=Range(*log), log_writes=writes)  # fmt: skip


def follower(ours: Speaks = THIS) -> FollowerStream:
    return FollowerStream((0, 0), EpochHistory(), 0, ours, "appliance a")


def leader(ours: Speaks = THIS) -> LeaderStream:
    return LeaderStream(MemorySource(log_of([1] * 5)), 1, ours, "appliance b")


def test_both_ends_state_their_versions_and_stream_as_before():
    lead, follow = leader(speaks("2.1")), follower(speaks("2.0"))
    hello = follow.hello()
    assert hello[3] == {"v": "2.0", "p": [1, 2], "f": [1, 1]}
    end = lead.receive(hello)
    assert end[3] == {"v": "2.1", "p": [1, 2], "w": 1}
    follow.receive(end)
    assert (lead.peer.version, lead.peer.agreed) == ("2.0", 2)
    assert (follow.peer.version, follow.peer.agreed) == ("2.1", 2)


def test_compatible_but_different_versions_replicate_every_record():
    records = log_of([1] * 5)
    lead = LeaderStream(MemorySource(records), 1, speaks("3.0", (2, 3), (1, 2), 1), "b")
    assert run(lead, follower(speaks("2.0", (1, 2))), []) == records


def test_an_older_follower_that_states_nothing_gets_the_answer_it_expects():
    lead = leader()
    end = lead.receive(["hello", 0, 0])
    assert len(end) == 3 and lead.peer.agreed == 1 and not lead.refused


def test_an_older_leader_that_states_nothing_is_followed():
    follow = follower()
    follow.hello()
    assert follow.receive(["end", 1, 0]) == ([], None)
    assert follow.peer.agreed == 1


def test_a_follower_with_no_protocol_in_common_is_refused_and_sent_nothing():
    lead = leader(speaks("2.0", (1, 2)))
    answer = lead.receive(follower(speaks("4.0", (3, 4))).hello())
    assert answer[0] == "refuse" and lead.refused == answer[1]
    assert "appliance b runs rackboot 4.0 (replication protocol 3-4)" in answer[1]
    assert "update this node to a version that speaks replication protocol 3-4" in answer[1]
    assert lead.next_message() is None
    with pytest.raises(Refused, match="refused-by-leader: incompatible replication"):
        follower().receive(answer)


def test_a_newer_leader_never_sends_records_in_a_format_the_follower_cannot_read():
    lead = leader(speaks("3.0", log=(1, 2), writes=2))
    answer = lead.receive(follower(speaks("2.0", log=(1, 1))).hello())
    assert answer[0] == "refuse" and lead.next_message() is None
    assert answer[1] == (
        "incompatible state log format: appliance b runs rackboot 2.0 (state log format 1), "
        "this node runs rackboot 3.0 (state log format 2): update appliance b to a version "
        "that speaks state log format 2 (a rolling update, one appliance at a time, never "
        "skips a common one)"
    )


def test_a_follower_refuses_a_leader_that_writes_a_format_it_cannot_read():
    follow = follower(speaks("2.0", log=(1, 1)))
    follow.hello()
    with pytest.raises(Refused, match="incompatible: incompatible state log format: appliance a"):
        follow.receive(["end", 1, 0, {"v": "3.0", "p": [1, 2], "w": 2}])
