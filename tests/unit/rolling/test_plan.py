"""The rolling update's planner with explicit time: the happy path of a two- and a
three-appliance rack, and every point where the roll stops."""

from __future__ import annotations

import pytest

from appliance.rolling.plan import (
    APPLYING,
    DONE,
    FAILED,
    HANDOVER,
    RUNNING,
    Apply,
    HandOver,
    RollError,
    Saved,
    Seen,
    from_record,
    start,
    step,
)

OLD, NEW = "1.0", "2.0"
T = 600.0


def roll_of(*appliances, me="a"):
    return start("r1", "ab" * 32, 100, NEW, me=me, appliances=list(appliances),
                 versions=dict.fromkeys(appliances, OLD), now=0.0, timeout=T)  # fmt: skip


def back(version=NEW, **kw) -> Seen:
    return Seen(True, version, **{"caught_up": True, **kw})


def test_the_standby_first_then_a_hand_over_then_the_old_holder():
    roll = roll_of("a", "b")
    assert roll.order == ["b", "a"] and roll.sources == ["a"]
    roll, did = step(roll, "a", {"b": back(OLD)}, 1.0)
    assert did == [Saved(), Apply("b")] and roll.phase == APPLYING
    roll, did = step(roll, "a", {"b": Seen(True, OLD, busy="installing")}, 5.0)
    assert roll.nodes["b"]["note"] == "installing"
    roll, did = step(roll, "a", {"b": Seen(False)}, 10.0)  # restarting
    assert roll.nodes["b"]["note"] == "restarting" and roll.state == RUNNING
    roll, did = step(roll, "a", {"b": back(trial=True)}, 20.0)
    assert roll.nodes["b"]["note"] == "health check"
    roll, did = step(roll, "a", {"b": back(caught_up=False)}, 25.0)
    assert roll.nodes["b"]["note"] == "catching up"
    roll, did = step(roll, "a", {"b": back()}, 30.0)
    assert roll.nodes["b"]["state"] == "updated" and roll.step == 1
    # the holder is next: it hands the lease over, once
    roll, did = step(roll, "a", {"b": back()}, 31.0)
    assert did == [Saved(), HandOver("b")] and roll.phase == HANDOVER
    roll, did = step(roll, "a", {"b": back()}, 32.0)
    assert did == []
    # the new holder reads the record and updates the old one
    roll = from_record(roll.record())
    roll, did = step(roll, "b", {"a": back(OLD)}, 33.0)
    assert did == [Saved(), Apply("a")]
    roll, did = step(roll, "b", {"a": back()}, 60.0)
    assert roll.state == DONE and did == [Saved()]
    assert {n: e["state"] for n, e in roll.nodes.items()} == {"a": "updated", "b": "updated"}


def test_three_appliances_update_one_at_a_time_and_hand_to_the_last_updated():
    roll = roll_of("a", "b", "c", me="b")
    assert roll.order == ["a", "c", "b"]
    seen = {"a": back(OLD), "c": back(OLD)}
    roll, did = step(roll, "b", seen, 1.0)
    assert did[-1] == Apply("a")
    roll, did = step(roll, "b", {**seen, "a": back()}, 2.0)
    roll, did = step(roll, "b", {**seen, "a": back()}, 3.0)
    assert did[-1] == Apply("c")  # never two at once
    roll, did = step(roll, "b", {"a": back(), "c": back()}, 4.0)
    roll, did = step(roll, "b", {"a": back(), "c": back()}, 5.0)
    assert did[-1] == HandOver("c")


def test_an_appliance_running_the_version_already_is_not_updated_again():
    roll = roll_of("a", "b")
    roll, did = step(roll, "a", {"b": back()}, 1.0)
    assert Apply("b") not in did and roll.step == 1


def test_a_failed_health_check_stops_the_roll_and_says_it_rolled_back():
    roll = roll_of("a", "b")
    roll, _ = step(roll, "a", {"b": back(OLD)}, 1.0)
    roll, did = step(roll, "a", {"b": back(OLD, failed=NEW, why="dhcp did not start")}, 40.0)
    assert roll.state == FAILED and did == [Saved()]
    assert roll.reason == f"b: its health check failed on {NEW}, it rolled back: dhcp did not start"
    assert roll.nodes["b"]["state"] == "rolled back"
    assert step(roll, "a", {"b": back()}, 50.0) == (roll, [])  # stopped: nothing more


def test_a_bundle_the_appliance_cannot_fetch_or_install_stops_the_roll():
    roll = roll_of("a", "b")
    roll, _ = step(roll, "a", {"b": back(OLD)}, 1.0)
    roll, did = step(roll, "a", {"b": back(OLD, error="bad signature")}, 2.0)
    assert roll.state == FAILED and roll.reason == "b: could not install the bundle: bad signature"
    assert roll.nodes["b"]["state"] == "failed"


def test_an_older_failure_of_another_version_does_not_stop_the_roll():
    roll = roll_of("a", "b")
    roll, _ = step(roll, "a", {"b": back(OLD)}, 1.0)
    roll, _ = step(roll, "a", {"b": back(OLD, failed="1.5", busy="installing")}, 2.0)
    assert roll.state == RUNNING


@pytest.mark.parametrize(
    ("seen", "what"),
    [
        (Seen(False), "not back"),
        (back(trial=True), "not back on 2.0 and healthy"),
        (back(caught_up=False), "not back on 2.0 and healthy"),
        (back(OLD), "not back on 2.0 and healthy"),
    ],
)
def test_an_appliance_not_back_updated_in_time_stops_the_roll(seen, what):
    roll = roll_of("a", "b")
    roll, _ = step(roll, "a", {"b": back(OLD)}, 1.0)
    roll, _ = step(roll, "a", {"b": seen}, 1.0 + T - 1)
    assert roll.state == RUNNING
    roll, did = step(roll, "a", {"b": seen}, 1.0 + T + 1)
    assert roll.state == FAILED and roll.reason == f"b: {what} within {T:g} s"
    assert did == [Saved()] and roll.nodes["b"]["state"] == "failed"


def test_an_unreachable_next_appliance_is_waited_for_then_the_roll_stops():
    roll = roll_of("a", "b")
    roll, did = step(roll, "a", {"b": Seen(False)}, 10.0)
    assert did == [] and roll.state == RUNNING
    roll, did = step(roll, "a", {"b": Seen(False)}, T + 1)
    assert roll.state == FAILED and roll.reason == f"b: unreachable within {T:g} s"


def test_no_updated_appliance_that_follows_means_no_hand_over():
    roll = roll_of("a", "b")
    roll, _ = step(roll, "a", {"b": back(OLD)}, 1.0)
    roll, _ = step(roll, "a", {"b": back()}, 2.0)
    roll, did = step(roll, "a", {"b": back(caught_up=False)}, 3.0)
    assert did == [] and roll.phase != HANDOVER
    roll, did = step(roll, "a", {"b": back(caught_up=False)}, 3.0 + T)
    assert roll.reason == f"a: no updated appliance to hand the lease to within {T:g} s"


def test_a_hand_over_that_does_not_happen_is_asked_again_then_stops_the_roll():
    roll = roll_of("a", "b")
    roll, _ = step(roll, "a", {"b": back(OLD)}, 1.0)
    roll, _ = step(roll, "a", {"b": back()}, 2.0)
    roll, did = step(roll, "a", {"b": back()}, 3.0)
    assert did[-1] == HandOver("b")
    roll, did = step(roll, "a", {"b": back()}, 3.0 + 16)
    assert did[-1] == HandOver("b")  # asked again
    roll, did = step(roll, "a", {"b": back()}, 3.0 + T + 1)
    assert roll.state == FAILED and "the lease was not handed over" in roll.reason


def test_a_roll_to_the_version_every_appliance_runs_is_refused():
    with pytest.raises(RollError, match="runs version 2.0 already"):
        start("r", "ab", 1, NEW, me="a", appliances=["a", "b"],
              versions={"a": NEW, "b": NEW}, now=0.0, timeout=T)  # fmt: skip


@pytest.mark.parametrize("record", [None, [], {"id": "x"}, {**roll_of("a", "b").record(),
                                                            "step": 9}])  # fmt: skip
def test_a_record_that_is_not_a_roll_is_refused(record):
    with pytest.raises(RollError):
        from_record(record)
