"""The provisioning workflow (plugins/provisioning/lifecycle.py), sans-IO with explicit time:
stages and deadlines, retries by power cycle, a spare taking a failed machine's place,
the race, records surviving a trip through the state (a failover's new active)."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.provisioning.lifecycle import STATES, Power, Record, Timeouts, Workflow

T = Timeouts(requested=60, discovered=30, loader=30, kernel=60, installing=120)
MAC1, MAC2, MAC3 = "52:54:00:00:00:01", "52:54:00:00:00:02", "52:54:00:00:00:03"


def rack(strategy: str = "retry", retries: int = 2) -> Workflow:
    flow = Workflow(T, retries=retries, strategy=strategy)
    flow.load(Record("web1", (MAC1,), "debian", pool="rack7", initrds=1))
    flow.load(Record("spare1", (MAC2,), "", pool="rack7", state="spare"))
    flow.load(Record("other", (MAC3,), "", pool="elsewhere", state="spare"))
    return flow


def boot(flow: Workflow, mac: str, now: float) -> None:
    flow.dhcp(mac, now)
    flow.fetched(mac, "loader", now + 1)
    flow.fetched(mac, "kernel", now + 2)
    flow.fetched(mac, "initrd:0", now + 3)
    flow.installer(mac, "started", now + 4)


def test_a_machine_passes_every_stage_and_is_provisioned():
    flow = rack()
    first = flow.request("web1", 100.0)
    assert first.power == [Power("web1", "on")] and first.attempts == 1
    assert flow.machines["web1"].deadline == 160.0
    assert flow.dhcp(MAC1, 110.0).saves[0].state == "discovered"
    assert flow.fetched(MAC1, "loader", 111.0).saves[0].state == "loader"
    assert flow.fetched(MAC1, "kernel", 112.0).saves[0].state == "loader"  # initrd still due
    assert flow.fetched(MAC1, "initrd:0", 113.0).saves[0].state == "kernel"
    assert flow.installer(MAC1, "started", 120.0).saves[0].deadline == 240.0
    assert flow.installer(MAC1, "progress", 200.0).saves[0].deadline == 320.0  # alive
    done = flow.installer(MAC1, "ok", 300.0)
    machine = flow.machines["web1"]
    assert machine.state == "provisioned" and machine.deadline is None
    assert done.successes == [200.0] and flow.next_deadline() is None
    assert [state for _, state, _ in machine.history] == [
        "requested", "discovered", "loader", "kernel", "installing", "provisioned"]  # fmt: skip


def test_a_hang_is_retried_by_power_cycle_then_a_spare_takes_the_profile():
    flow = rack(retries=2)
    flow.request("web1", 0.0)
    flow.dhcp(MAC1, 10.0)
    assert flow.tick(39.0).power == []  # not yet: discovered's deadline is 40
    retry = flow.tick(40.0)
    assert retry.power == [Power("web1", "cycle")] and retry.failures == [("discovered", "timeout")]
    assert flow.machines["web1"].state == "requested" and flow.machines["web1"].attempt == 1
    flow.tick(100.0)  # nothing happened after the first cycle: the second
    assert flow.machines["web1"].attempt == 2
    last = flow.tick(160.0)  # and the retries are spent
    web1, spare = flow.machines["web1"], flow.machines["spare1"]
    assert web1.state == "failed" and web1.deprovision and web1.deadline is None
    assert spare.state == "requested" and spare.profile == "debian" and spare.replaces == "web1"
    assert spare.initrds == 1 and last.spares_used == 1
    assert last.power == [Power("web1", "off"), Power("spare1", "on")]
    assert flow.machines["other"].state == "spare"  # another pool's spare stays
    boot(flow, MAC2, 170.0)
    assert flow.installer(MAC2, "ok", 400.0).successes == [240.0]


def test_a_failure_event_is_a_failed_attempt_at_once():
    flow = rack(retries=0)
    flow.request("web1", 0.0)
    boot(flow, MAC1, 1.0)
    out = flow.installer(MAC1, "failed", 20.0, "disk not found")
    assert out.failures == [("installing", "installer")]
    assert flow.machines["web1"].history[-1][2] == "installer failed: disk not found"
    assert flow.machines["web1"].state == "failed"
    assert flow.machines["spare1"].state == "requested"


def test_no_spare_when_the_profile_forbids_it_or_the_pool_has_none():
    flow = rack(retries=0)
    flow.load(dataclasses.replace(flow.machines["web1"], spare_ok=False))
    flow.request("web1", 0.0)
    out = flow.tick(60.0)
    assert out.spares_used == 0 and flow.machines["spare1"].state == "spare"
    flow = rack(retries=0)
    flow.forget("spare1")
    flow.request("web1", 0.0)
    assert flow.tick(60.0).spares_used == 0 and flow.machines["web1"].state == "failed"


def test_the_race_releases_the_slower_machine_back_to_its_pool():
    flow = rack(strategy="race")
    start = flow.request("web1", 0.0)
    assert {p.name for p in start.power} == {"web1", "spare1"} and start.attempts == 2
    assert flow.machines["web1"].twin == "spare1" and flow.machines["spare1"].twin == "web1"
    boot(flow, MAC2, 5.0)  # the spare is faster
    boot(flow, MAC1, 8.0)
    won = flow.installer(MAC2, "ok", 50.0)
    assert Power("web1", "off") in won.power
    web1, spare = flow.machines["web1"], flow.machines["spare1"]
    assert spare.state == "provisioned" and spare.twin == ""
    assert web1.state == "spare" and web1.profile == "" and web1.deadline is None
    assert flow.installer(MAC1, "ok", 60.0).saves == []  # too late: it was released


def test_events_of_unknown_machines_or_out_of_order_change_nothing():
    flow = rack()
    assert flow.dhcp("aa:bb:cc:dd:ee:ff", 1.0).saves == []
    assert flow.installer(MAC1, "ok", 1.0).saves == []  # web1 was never requested
    flow.request("web1", 0.0)
    assert flow.fetched(MAC1, "kernel", 1.0).saves == []  # no DHCP yet


def test_a_record_survives_the_state_log_and_a_new_active_resumes_its_deadline():
    flow = rack()
    flow.request("web1", 0.0)
    flow.dhcp(MAC1, 10.0)
    wire = {name: msgpack.packb(r.to_dict()) for name, r in flow.machines.items()}
    successor = Workflow(T, retries=2)  # the standby, from the replicated records
    for data in wire.values():
        successor.load(Record.from_dict_untrusted(msgpack.unpackb(data)))
    assert successor.machines == flow.machines
    assert successor.next_deadline() == 40.0
    assert successor.tick(40.0).power == [Power("web1", "cycle")]


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"name": "x"},
        {"name": "x", "macs": [], "profile": "", "state": "bogus"},
        {"name": "", "macs": [], "profile": ""},
        {"name": "x", "macs": [], "profile": "", "evil": 1},
    ],
)
def test_a_record_that_is_no_record_is_refused(bad):
    with pytest.raises(ValueError):
        Record.from_dict_untrusted(bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["dhcp", "loader", "kernel", "initrd:0", "started",
                                          "progress", "ok", "failed", "tick", "request"]),
                          st.sampled_from([MAC1, MAC2, MAC3]), st.floats(0, 50)),
                max_size=40))  # fmt: skip
def test_any_sequence_keeps_every_record_consistent(steps):
    flow = rack(strategy="race")
    now = 0.0
    names = {MAC1: "web1", MAC2: "spare1", MAC3: "other"}
    for what, mac, step in steps:
        now += step
        if what == "dhcp":
            flow.dhcp(mac, now)
        elif what in ("loader", "kernel", "initrd:0"):
            flow.fetched(mac, what, now)
        elif what == "tick":
            flow.tick(now)
        elif what == "request":
            flow.request(names[mac], now)
        else:
            flow.installer(mac, what, now)
        for machine in flow.machines.values():
            assert machine.state in STATES
            assert (machine.deadline is None) == (machine.state not in STATES[:5])
            assert machine.attempt <= 2
            if machine.twin:  # a race pairs two machines both ways
                assert flow.machines[machine.twin].twin in (machine.name, "")
