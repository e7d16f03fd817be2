"""The rack checks as pure verdicts on a node's status: links, the election's members,
the lease, the state log and its replication."""

from __future__ import annotations

import pytest

from appliance.doctor.findings import Verdict
from appliance.doctor.rackchecks import (
    Rack,
    judge_lease,
    judge_links,
    judge_log,
    judge_members,
    judge_replication,
)

RACK = Rack(peers={"B": "10.0.0.2:7471"}, witnesses={"W": "10.0.0.3:7471"}, lease=1.0)


def site(*rows: dict) -> dict:
    me = {"node_id": "A", "name": "a", "rack": "r1", "self": True, "state": "self"}
    return {"rack": "r1", "cluster": {"state": "member", "site": [me, *rows]}}


def test_links_up_pass_and_refused_fail():
    up = {"node_id": "B", "name": "b", "rack": "r1", "state": "up"}
    assert judge_links(site(up), RACK).verdict is Verdict.PASS
    refused = {**up, "state": "refused", "reason": "certificate revoked"}
    finding = judge_links(site(refused), RACK)
    assert finding.verdict is Verdict.FAIL and "b: certificate revoked" in finding.summary


def test_an_offline_appliance_fails_in_this_rack_and_warns_in_another():
    here = {"node_id": "B", "name": "b", "rack": "r1", "state": "down", "reason": "no keepalive"}
    elsewhere = {"node_id": "X", "name": "x", "rack": "r9", "state": "down"}
    assert judge_links(site(here), RACK).verdict is Verdict.FAIL
    assert judge_links(site(elsewhere), RACK).verdict is Verdict.WARN
    # a peer of [ha] offline counts as this rack's whatever rack it names
    assert judge_links(site({**elsewhere, "node_id": "B"}), RACK).verdict is Verdict.FAIL


def test_no_links_warn_with_ha_peers_and_standalone_skips():
    assert judge_links(site(), RACK).verdict is Verdict.WARN
    assert judge_links(site(), Rack({}, {})).verdict is Verdict.PASS
    alone = {"cluster": {"state": "not a member"}}
    assert judge_links(alone, RACK).verdict is Verdict.SKIP


def ha(heard: dict, **more) -> dict:
    return {"role": "standby", "ha": {"mode": "embedded", "transport": {"heard": heard}, **more}}


@pytest.mark.parametrize("kind", ["peers", "witnesses"])
def test_members_heard_lately_pass_stale_or_never_fail(kind):
    member = "B" if kind == "peers" else "W"
    assert judge_members(ha({member: 0.2}), RACK, kind).verdict is Verdict.PASS
    stale = judge_members(ha({member: 5.5}), RACK, kind)  # 5 lease periods of 1 s
    assert stale.verdict is Verdict.FAIL and member in stale.summary
    never = judge_members(ha({}), RACK, kind)
    assert never.verdict is Verdict.FAIL and "never heard" in never.details[0]
    assert ("rackboot witness" in never.action) == (kind == "witnesses")


def test_members_skip_without_an_election_or_without_members():
    assert judge_members({"ha": {"mode": "standalone"}}, RACK, "peers").verdict is Verdict.SKIP
    assert judge_members(ha({}), Rack({}, {}), "witnesses").verdict is Verdict.SKIP
    # a long lease waits longer before calling a member lost
    slow = Rack(RACK.peers, RACK.witnesses, lease=4.0)
    assert judge_members(ha({"W": 15.0}), slow, "witnesses").verdict is Verdict.PASS


def test_the_lease():
    assert judge_lease({"ha": {"mode": "standalone"}}, {}).verdict is Verdict.PASS
    active = {"role": "active", "mode": "embedded", "epoch": 3, "valid_for": 0.8,
              "vip": {"address": "10.0.0.200/24", "held": True}, "election": {}}  # fmt: skip
    finding = judge_lease({"ha": active}, {})
    assert finding.verdict is Verdict.PASS and "epoch 3" in finding.summary
    lost_vip = {**active, "vip": {"address": "10.0.0.200/24", "held": False}}
    assert judge_lease({"ha": lost_vip}, {}).verdict is Verdict.FAIL
    standby = {"role": "standby", "mode": "embedded", "election": {"holder_seen": "A"}}
    assert judge_lease({"ha": standby}, {"A": "a"}).summary == "standby: a holds the lease"
    nobody = {**standby, "election": {"holder_seen": ""}}
    assert judge_lease({"ha": nobody}, {}).verdict is Verdict.FAIL
    resting = {**standby, "election": {"holder_seen": "A", "maintenance": True}}
    assert judge_lease({"ha": resting}, {}).verdict is Verdict.WARN
    mismatch = {**standby, "election": {"membership": {"blocked": "mismatch"}}}
    assert "disagree" in judge_lease({"ha": mismatch}, {}).summary


def replication(**fields) -> dict:
    return {"role": "active", "state": {"replication": fields}}


def test_replication_on_the_active():
    ok = {"B": {"stage": "stream", "lag": 0, "counted": True}}
    assert judge_replication(replication(followers=ok), RACK, {}).verdict is Verdict.PASS
    missing = judge_replication(replication(followers={}), RACK, {"B": "b"})
    assert missing.verdict is Verdict.FAIL and missing.summary == "not connected: b"
    declared = {"B": {**ok["B"], "counted": False}}
    finding = judge_replication(replication(followers=declared), RACK, {})
    assert finding.verdict is Verdict.FAIL and "declared ineligible: B" in finding.summary
    behind = {"B": {"stage": "snapshot", "lag": 10, "counted": True}}
    assert judge_replication(replication(followers=behind), RACK, {}).verdict is Verdict.WARN


def test_replication_on_a_standby_and_without_peers():
    following = {"role": "standby", "state": {"replication": {"following": {
        "leader": "A", "stage": "stream"}}}}  # fmt: skip
    assert judge_replication(following, RACK, {"A": "a"}).summary == "following a's log"
    lost = {"role": "standby", "state": {"replication": {"following": {}}}}
    assert judge_replication(lost, RACK, {}).verdict is Verdict.WARN
    assert judge_replication({"state": {}}, Rack({}, {}), {}).verdict is Verdict.SKIP


def test_the_state_log():
    healthy = {"state": {"keys": 3, "lsn": 9, "uncommitted": 0, "problem": "", "damage": []}}
    assert judge_log(healthy).verdict is Verdict.PASS
    damaged = {"state": {**healthy["state"], "damage": [{"at": 4}], "resync_needed": True}}
    finding = judge_log(damaged)
    assert finding.verdict is Verdict.FAIL and "damaged records" in finding.summary
    assert "resync" in finding.summary
