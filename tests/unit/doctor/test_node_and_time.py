"""The node's own checks and the time checks, as pure verdicts on given facts."""

from __future__ import annotations

from appliance.doctor.findings import Verdict
from appliance.doctor.nodechecks import judge_node, judge_services
from appliance.doctor.timechecks import (
    EARLIEST_PLAUSIBLE,
    ClockSync,
    SkewSample,
    judge_clock,
    judge_skew,
    skew_samples,
)

CORE = {"name": "a", "rack": "r1", "role": "active", "version": "0.1", "uptime": 12.0, "pid": 7}
NOW = 1_795_000_000.0  # 2026


def test_no_node_fails_saying_what_to_do():
    finding = judge_node(None, "no node answers on /run/rb.sock (no such socket)")
    assert finding.verdict is Verdict.FAIL and "/run/rb.sock" in finding.summary
    assert "rackboot run" in finding.action and "--socket" in finding.action


def test_a_starting_node_warns_and_a_ready_one_passes():
    assert judge_node({"core": {**CORE, "ready": False}}, "").verdict is Verdict.WARN
    finding = judge_node({"core": {**CORE, "ready": True}}, "")
    assert finding.verdict is Verdict.PASS and "node a (rack r1), active" in finding.summary


def test_services_failed_starting_or_running():
    def services(**states):
        return judge_services({"core": {"services": states}})

    failed = services(**{"dhcp.server": "failed", "tftp.server": "running"})
    assert failed.verdict is Verdict.FAIL and failed.summary == "failed: dhcp.server"
    assert services(**{"a": "starting", "b": "pending"}).verdict is Verdict.WARN
    done = services(**{"a": "running", "ra.responder": "stopped"})
    assert done.verdict is Verdict.PASS
    assert done.summary == "1 service running (ra.responder finished: nothing to serve)"


def test_a_clock_before_this_software_fails():
    finding = judge_clock(86_400.0, ClockSync(True))
    assert finding.verdict is Verdict.FAIL and "1970-01-02" in finding.summary
    assert judge_clock(EARLIEST_PLAUSIBLE + 1, ClockSync(True)).verdict is Verdict.PASS


def test_an_unsynchronized_clock_warns_and_an_unknown_state_is_said():
    finding = judge_clock(NOW, ClockSync(False, 16.0))
    assert finding.verdict is Verdict.WARN and "NTP" in finding.action
    assert judge_clock(NOW, ClockSync(True, 0.004)).summary.endswith("max error 4 ms")
    unknown = judge_clock(NOW, ClockSync(None, why_unknown="no adjtimex(2) here"))
    assert unknown.verdict is Verdict.PASS and "no adjtimex(2) here" in unknown.summary


def test_skews_come_from_links_and_from_replication():
    core = {
        "cluster": {"site": [
            {"node_id": "A", "name": "a", "self": True, "clock_skew": 0.0, "state": "self"},
            {"node_id": "B", "name": "b", "state": "up", "clock_skew": 0.25},
            {"node_id": "C", "name": "c", "state": "down", "clock_skew": 9.0},  # stale
            {"node_id": "D", "name": "d", "state": "up", "clock_skew": None},
        ]},
        "state": {"replication": {"followers": {"B": {"clock_skew": -0.5}, "E": {}}}},
    }  # fmt: skip
    assert skew_samples(core) == [
        SkewSample("b", 0.25, "cluster link"),
        SkewSample("b", -0.5, "replication"),
    ]


def test_skew_thresholds():
    def skew(*values: float):
        return judge_skew([SkewSample(f"p{i}", v, "cluster link") for i, v in enumerate(values)],
                          True, 10.0)  # fmt: skip

    assert skew(0.01, -0.2).verdict is Verdict.PASS
    warned = skew(0.01, -2.5)
    assert warned.verdict is Verdict.WARN and "p1's clock is -2.500 s" in warned.summary
    failed = skew(11.0)
    assert failed.verdict is Verdict.FAIL and "max_clock_skew (10 s)" in failed.summary


def test_no_skew_measured():
    assert judge_skew([], False, 10.0).verdict is Verdict.SKIP
    finding = judge_skew([], True, 10.0)
    assert finding.verdict is Verdict.WARN and "[cluster]" in finding.action
