"""The leader's commit rule and whom it declares ineligible, with explicit time."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.state.commit import CommitRule


@dataclass
class F:
    acked: int
    streaming: bool = True
    skew: float | None = 0.0


def rule() -> CommitRule:
    return CommitRule(["b", "c"], ack_timeout=0.5, max_clock_skew=10.0)


def test_a_record_commits_when_every_counted_standby_has_it():
    followers = {"b": F(7), "c": F(4)}
    assert rule().committable(9, followers, frozenset()) == 4
    assert rule().committable(9, followers, frozenset({"c"})) == 7
    assert rule().committable(5, followers, frozenset({"c"})) == 5  # not beyond our disk
    assert rule().committable(9, {"b": F(7)}, frozenset()) == 0  # c follows nobody: waits


def lagging(r, now, followers, declared=frozenset(), pending=True, leading=True, last=9):
    return r.lagging(now, leading=leading, last=last, pending=pending, followers=followers,
                     declared=declared)  # fmt: skip


def test_who_is_declared_and_when():
    r = rule()
    assert lagging(r, 0.0, {"b": F(9)}) == {"c"}  # c holds a record up and does not follow
    assert lagging(r, 0.0, {"b": F(9)}, pending=False) == frozenset()  # nothing waits for c
    assert lagging(r, 0.0, {"b": F(5), "c": F(9)}) == frozenset()  # b is late, not yet...
    assert lagging(r, 0.4, {"b": F(5), "c": F(9)}) == frozenset()
    assert lagging(r, 0.6, {"b": F(5), "c": F(9)}) == {"b"}  # ... past the timeout it is
    assert lagging(r, 0.7, {"b": F(8), "c": F(9)}, declared=frozenset({"b"})) == {"b"}
    assert lagging(r, 0.8, {"b": F(9), "c": F(9)}, declared=frozenset({"b"})) == frozenset()
    assert lagging(r, 0.9, {"b": F(9, streaming=False), "c": F(9)},
                   declared=frozenset({"b"})) == {"b"}  # acked, but more is on its way
    assert lagging(r, 1.0, {"b": F(9, skew=11.0), "c": F(9)}) == {"b"}  # its clock is off
    assert lagging(r, 1.0, {}, leading=False) == frozenset()  # a standby declares nobody
