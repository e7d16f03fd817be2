"""The doctor's frame: checks collected from every plugin (the core's first), run with
a bug in one contained, options nobody answers failed, the report and its exit code."""

from __future__ import annotations

import json

from appliance.api import DoctorCheck, DoctorOptions, hookimpl
from appliance.doctor.findings import (
    DoctorContext,
    Verdict,
    exit_code,
    failed,
    passed,
    skipped,
    warned,
)
from appliance.doctor.report import as_json, render_text
from appliance.doctor.run import collect, run_checks
from appliance.errors import EXIT_DOCTOR_FAIL, EXIT_DOCTOR_WARN, EXIT_OK, EXIT_UNREACHABLE
from tests.support.plugins import configured

OK = passed("a", "fine", details=("row 1",))
WARN = warned("b", "so-so", "because", "do this")
FAIL = failed("c", "broken", "it matters", "fix it", details=("row 2",))


def test_exit_codes_say_the_worst_verdict():
    assert exit_code([OK, skipped("d", "n/a")], True) == EXIT_OK
    assert exit_code([OK, WARN], True) == EXIT_DOCTOR_WARN
    assert exit_code([OK, WARN, FAIL], True) == EXIT_DOCTOR_FAIL
    assert exit_code([OK], False) == EXIT_UNREACHABLE  # no node: 4 whatever else


def test_the_text_report():
    text = render_text([OK, WARN, FAIL]).splitlines()
    assert text[0].split() == ["PASS", "a", "fine"]  # a pass: one line, no details
    assert text[1:4] == ["WARN  b                  so-so", "      why: because",
                         "      do:  do this"]  # fmt: skip
    assert text[4:8] == ["FAIL  c                  broken", "      why: it matters",
                         "      do:  fix it", "        row 2"]  # fmt: skip
    assert text[-1] == "FAIL: 1 passed, 1 warned, 1 failed, 0 skipped"
    assert "        row 1" in render_text([OK], verbose=True).splitlines()


def test_the_json_report():
    report = json.loads(json.dumps(as_json([OK, FAIL], 7, {"node": "a"})))
    assert report["verdict"] == "fail" and report["exit_code"] == 7 and report["node"] == "a"
    assert report["counts"] == {"pass": 1, "warn": 0, "fail": 1, "skip": 0}
    assert report["checks"][1] == {"check": "c", "verdict": "fail", "summary": "broken",
                                   "reason": "it matters", "action": "fix it",
                                   "details": ["row 2"], "data": {}}  # fmt: skip


class Probing:
    """A plugin with a check of its own, one that raises, and one answering an option."""

    @hookimpl
    def rackboot_doctor_checks(self, options):
        def bug(ctx):
            raise KeyError("oops")

        checks = [DoctorCheck("zz.fine", lambda ctx: [passed("zz.fine", "ok")]),
                  DoctorCheck("zz.bug", bug, needs_node=False)]  # fmt: skip
        if options.dhcp_probe:
            checks.append(DoctorCheck("zz.probe", lambda ctx: [], needs_node=False,
                                      option="dhcp_probe"))  # fmt: skip
        return checks


class Broken:
    @hookimpl
    def rackboot_doctor_checks(self, options):
        raise RuntimeError("cannot")


def test_checks_come_from_the_core_first_then_each_plugin(tmp_path):
    _, pm = configured(tmp_path, zz=Probing())
    checks, problems = collect(pm, DoctorOptions())
    names = [c.name for c in checks]
    assert names[0] == "node" and names[-2:] == ["zz.fine", "zz.bug"] and problems == []


def test_a_check_that_raises_fails_alone_and_without_a_node_others_skip(tmp_path):
    config, pm = configured(tmp_path, zz=Probing())
    checks, _ = collect(pm, DoctorOptions())
    ctx = DoctorContext(config, DoctorOptions(), 1_795_000_000.0, None, "no node answers on X")
    found = {f.check: f for f in run_checks(ctx, checks)}
    assert found["zz.bug"].verdict is Verdict.FAIL
    assert found["zz.bug"].summary == "the check itself failed: KeyError: 'oops'"
    assert found["zz.fine"].verdict is Verdict.SKIP and found["services"].verdict is Verdict.SKIP
    assert found["node"].verdict is Verdict.FAIL  # the node check runs without a node
    assert found["time.clock"].verdict is not Verdict.SKIP


def test_an_option_no_plugin_answers_fails_and_a_broken_hook_is_named(tmp_path):
    _, pm = configured(tmp_path, zz=Broken())
    checks, problems = collect(pm, DoctorOptions(dhcp_probe="eth1"))
    assert {p.check for p in problems} == {"doctor", "dhcp-probe"}
    [probe] = [p for p in problems if p.check == "dhcp-probe"]
    assert probe.verdict is Verdict.FAIL and probe.summary.startswith("--dhcp-probe eth1")
    _, pm = configured(tmp_path, zz=Probing())
    checks, problems = collect(pm, DoctorOptions(dhcp_probe="eth1"))
    assert problems == [] and "zz.probe" in [c.name for c in checks]
