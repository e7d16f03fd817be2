"""The VIP guard's decisions with explicit time (the process around it: tests/real/test_vip_guard.py)."""

from __future__ import annotations

import math

from appliance.ha.vipguard import GuardCore, ip_argv


def test_a_leftover_address_is_removed_at_start():
    core = GuardCore()
    assert core.actions(0.0) == ["remove"]
    assert core.actions(0.1) == [] and core.timeout(0.1) is None  # nothing to do until told


def test_hold_adds_refreshes_and_removes_at_the_deadline():
    core = GuardCore(refresh=0.5)
    core.actions(0.0)
    assert core.command("hold 10.8") is None
    assert core.actions(10.0) == ["add"]
    assert core.timeout(10.0) == 0.5  # the next refresh
    assert core.actions(10.2) == [] and math.isclose(core.timeout(10.2), 0.3)
    assert core.actions(10.5) == ["add"]  # refresh of the kernel lifetime
    assert math.isclose(core.timeout(10.6), 0.2)  # the deadline comes before the next refresh
    assert core.actions(10.8) == ["remove"]  # the deadline: no later one came
    assert core.actions(10.9) == [] and core.timeout(10.9) is None


def test_a_later_hold_keeps_the_address():
    core = GuardCore(refresh=0.5)
    core.actions(0.0)
    core.command("hold 1.0")
    assert core.actions(0.1) == ["add"]
    core.command("hold 1.25")
    assert core.actions(1.0) == ["add"]  # refresh due; still held
    assert core.actions(1.25) == ["remove"]


def test_drop_and_the_nodes_death_remove_at_once():
    core = GuardCore()
    core.actions(0.0)
    core.command("hold 5")
    core.actions(1.0)
    core.command("drop")
    assert core.actions(1.0) == ["remove"]
    core.command("hold 5")
    core.actions(1.1)
    core.node_gone()
    assert core.done and core.actions(1.1) == ["remove"]


def test_failures_are_retried_later_not_in_a_loop():
    core = GuardCore(refresh=0.5, retry=0.25)
    core.actions(0.0)
    core.command("hold 5")
    assert core.actions(1.0) == ["add"]
    core.failed("add", 1.0)
    assert core.actions(1.1) == [] and math.isclose(core.timeout(1.1), 0.15)
    assert core.actions(1.25) == ["add"]
    core.command("drop")
    assert core.actions(1.3) == ["remove"]
    core.failed("remove", 1.3)  # the second failure in a row waits twice as long
    assert core.actions(1.7) == [] and math.isclose(core.timeout(1.7), 0.1)
    assert core.actions(1.8) == ["remove"]
    core.succeeded()
    core.command("hold 5")
    assert core.actions(1.9) == ["add"]
    core.failed("add", 1.9)
    assert math.isclose(core.retry_at, 2.15)  # back to the first delay after a success


def test_bad_commands_are_named_and_change_nothing():
    core = GuardCore()
    core.actions(0.0)
    core.command("hold 5")
    for bad in ("hold", "hold nan", "hold inf", "hold x", "grab 3", ""):
        assert core.command(bad) is not None
    assert core.deadline == 5.0


def test_the_kernel_lifetime_is_the_last_resort():
    argv = ip_argv("add", "eth1", "10.0.0.1/24")
    assert argv[argv.index("valid_lft") + 1] == argv[argv.index("preferred_lft") + 1] == "2"
    assert ip_argv("remove", "eth1", "10.0.0.1/24")[:4] == ["ip", "-4", "addr", "del"]
