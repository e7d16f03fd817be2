"""Versions between nodes (appliance/compat.py): the common protocol, the refusal's words."""

from __future__ import annotations

import pytest

from appliance import compat
from appliance.compat import OLDEST, Range, Speaks, judge

OURS = Speaks("2.0", cluster=Range(2, 3), election=Range(1, 2), replication=Range(2, 2),
              log=Range(1, 2), log_writes=2)  # fmt: skip


@pytest.mark.parametrize(
    ("ours", "theirs", "common"),
    [((1, 3), (2, 5), 3), ((1, 1), (1, 1), 1), ((1, 1), (2, 3), None), ((2, 4), (1, 2), 2)],
)
def test_the_common_protocol_is_the_highest_both_speak(ours, theirs, common):
    assert Range(*ours).common(Range(*theirs)) == common
    assert Range(*theirs).common(Range(*ours)) == common


def test_an_overlapping_peer_is_compatible_and_uses_the_highest_common_protocol():
    peer = judge("election", "node b", "1.5", [2, 4], OURS)
    assert peer == compat.Peer("1.5", Range(2, 4), 2, "")
    assert peer.status() == {"version": "1.5", "speaks": "2-4", "uses": 2, "problem": ""}


def test_a_peer_that_states_nothing_speaks_protocol_1():
    peer = judge("election", "node b", None, None, OURS)
    assert peer.span == OLDEST and peer.agreed == 1 and peer.version == compat.UNSTATED


@pytest.mark.parametrize(
    ("version", "span", "older", "newer"),
    [("1.0", [1, 1], "node b", "2-3"), ("3.0", [4, 5], "this node", "4-5")],
)
def test_an_incompatible_peer_is_refused_naming_both_versions_and_whom_to_update(
    version, span, older, newer
):
    peer = judge("cluster", "node b", version, span, OURS)
    assert peer.agreed is None
    assert peer.problem == (
        f"incompatible cluster protocol: node b runs rackboot {version} (cluster protocol "
        f"{Range(*span)}), this node runs rackboot 2.0 (cluster protocol 2-3): update {older} "
        f"to a version that speaks cluster protocol {newer} (a rolling update, one appliance "
        "at a time, never skips a common one)"
    )


@pytest.mark.parametrize("span", [[2, 1], [0, 1], [1], "1-2", [True, 2], [1, 2**16], 7])
def test_a_malformed_range_is_refused_not_guessed(span):
    peer = judge("replication", "node b", "1.0", span, OURS)
    assert peer.agreed is None and "malformed replication protocol range" in peer.problem


def test_a_long_or_strange_version_is_shortened_or_unstated():
    assert judge("election", "b", "9" * 500, [1, 1], OURS).version == "9" * 64
    assert judge("election", "b", 42, [1, 1], OURS).version == compat.UNSTATED


def test_this_software_speaks_every_protocol_it_ever_shipped_from_1():
    """A rolling update from the first release with version statements needs protocol 1 of
    each channel (or the previous release's highest) still in the range."""
    for channel in ("cluster", "election", "replication", "log"):
        assert compat.THIS.range(channel).lo == 1
    assert compat.THIS.log_writes in compat.THIS.log
