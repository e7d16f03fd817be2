"""Admission of HTTP connections: the cap per source and the fair displacement, explicit time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.httpboot.admission import BUSY, HEAD, IDLE, Admission, Admitted, Refused
from tests.unit.test_architecture import violations


def admitted(decision: Admitted | Refused) -> Admitted:
    assert isinstance(decision, Admitted), decision
    return decision


def test_the_module_is_sans_io():
    assert violations("plugins.httpboot.admission") == []


def test_a_source_gets_at_most_its_cap_and_a_slot_again_when_one_closes():
    table = Admission(max_connections=100, max_per_source=3)
    conns = [admitted(table.admit("10.0.0.9", now=0.0)).conn for _ in range(3)]
    assert table.admit("10.0.0.9", now=1.0) == Refused("per-source")
    assert admitted(table.admit("10.0.0.10", now=1.0)).evict is None  # another source is not capped
    table.release(conns[0])
    assert admitted(table.admit("10.0.0.9", now=2.0)).evict is None
    assert table.held_by("10.0.0.9") == 3 and len(table) == 4


def test_a_full_table_gives_the_newcomer_the_oldest_wait_of_the_heaviest_source():
    table = Admission(max_connections=6, max_per_source=10)
    flood = [admitted(table.admit("10.0.0.66", now=float(t))).conn for t in range(4)]
    one = admitted(table.admit("10.0.0.1", now=4.0)).conn
    admitted(table.admit("10.0.0.2", now=5.0))
    table.mark(flood[0], BUSY, now=6.0)  # answering its request: never displaced
    decision = admitted(table.admit("10.0.0.3", now=7.0))
    assert (decision.evict, decision.evicted_phase) == (flood[1], HEAD)
    assert decision.evicted_source == "10.0.0.66"  # named in the server's log line
    assert table.phase(flood[1]) is None and table.held_by("10.0.0.66") == 3
    # an idle kept-alive connection waits since it went idle: now the flood's oldest
    table.mark(flood[3], IDLE, now=7.5)
    table.mark(flood[2], BUSY, now=7.5)
    assert admitted(table.admit("10.0.0.4", now=8.0)).evict == flood[3]
    # the flood's two left are busy: the oldest wait among those holding one goes
    assert admitted(table.admit("10.0.0.5", now=9.0)).evict == one
    # 10.0.0.5 holds one now, as many as any source with a waiting connection
    assert table.admit("10.0.0.5", now=9.0) == Refused("full")
    assert table.held_by("10.0.0.66") == 2 and len(table) == 6


def test_equal_sources_give_way_to_a_newcomer_oldest_wait_first():
    table = Admission(max_connections=3, max_per_source=10)
    a = admitted(table.admit("10.0.0.1", now=0.0)).conn
    b = admitted(table.admit("10.0.0.2", now=1.0)).conn
    admitted(table.admit("10.0.0.3", now=2.0))
    table.mark(a, BUSY, now=3.0)
    table.mark(a, IDLE, now=4.0)  # went idle after b started waiting: b's wait is older
    assert admitted(table.admit("10.0.0.4", now=5.0)).evict == b
    # a source never displaces its own connections, nor one of a source holding as many
    assert table.admit("10.0.0.4", now=6.0) == Refused("full")


def test_same_source_on_a_full_table_is_refused_and_release_is_idempotent():
    table = Admission(max_connections=2, max_per_source=5)
    first = admitted(table.admit("10.0.0.1", now=0.0)).conn
    admitted(table.admit("10.0.0.1", now=0.0))
    assert table.admit("10.0.0.1", now=1.0) == Refused("full")
    second = admitted(table.admit("10.0.0.2", now=1.0))
    assert second.evict == first
    table.release(first)  # the displaced connection's own task ends later: no double count
    table.mark(first, IDLE, now=2.0)
    assert table.held_by("10.0.0.1") == 1 and len(table) == 2
    table.release(second.conn)
    table.release(second.conn)
    assert table.held_by("10.0.0.2") == 0 and len(table) == 1


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["admit", "release", "head", "idle", "busy"]),
            st.integers(0, 5),
            st.integers(0, 40),
        ),  # fmt: skip
        max_size=120,
    )
)
def test_invariants_hold_for_any_sequence(steps):
    """Never over either bound; only waiting connections displaced, and only from a
    source holding more than the newcomer's; every count matches the live set."""
    table = Admission(max_connections=8, max_per_source=4)
    live: dict[int, tuple[str, str]] = {}
    for now, (op, who, pick) in enumerate(steps):
        source = f"10.0.0.{who}"
        if op == "admit":
            before = sum(1 for s, _ in live.values() if s == source)
            decision = table.admit(source, float(now))
            if isinstance(decision, Refused):
                assert before >= 4 or len(live) >= 8
                continue
            if decision.evict is not None:
                victim_source, victim_phase = live.pop(decision.evict)
                assert victim_phase in (HEAD, IDLE) and decision.evicted_phase == victim_phase
                assert sum(1 for s, _ in live.values() if s == victim_source) + 1 > before
            else:
                assert len(live) < 8
            live[decision.conn] = (source, HEAD)
        elif live:
            conn = sorted(live)[pick % len(live)]
            if op == "release":
                table.release(conn)
                del live[conn]
            else:
                phase = {"head": HEAD, "idle": IDLE, "busy": BUSY}[op]
                table.mark(conn, phase, float(now))
                live[conn] = (live[conn][0], phase)
        assert len(table) == len(live) <= 8
        for conn, (s, phase) in live.items():
            assert table.phase(conn) == phase
            assert table.held_by(s) == sum(1 for t, _ in live.values() if t == s) <= 4


def test_bounds_must_be_positive():
    with pytest.raises(ValueError):
        Admission(max_connections=0, max_per_source=1)
