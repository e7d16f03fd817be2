"""The health check of a slot on trial: node ready, a peer reachable, hooks exit 0; a
definite failure (configuration refused, the service exiting for good) ends the wait at
once, a transient one is polled until the deadline."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

from appliance.cli import main
from appliance.errors import Unreachable
from appliance.firmware import commands, health
from appliance.firmware.health import (
    POLL,
    problems,
    refused_configuration,
    service_gave_up,
    systemd_show,
    wait_healthy,
)

READY = {"core": {"ready": True, "cluster": {"state": "off"}}}


def peer(health):
    return {"name": "rb2", "health": health}


def clustered(*peers):
    site = [{"name": "rb1", "self": True, "health": "online"}, *peers]
    return {"core": {"ready": True, "cluster": {"state": "member", "site": site}}}


def test_ready_node_peers_and_hooks(tmp_path):
    assert problems(lambda: READY, tmp_path) == []
    assert problems(lambda: {"core": {"ready": False}}, tmp_path) == [
        "node: not ready (a service has not started)"]  # fmt: skip
    assert problems(lambda: clustered(peer("online"), peer("offline")), tmp_path) == []
    assert problems(lambda: clustered(peer("offline")), tmp_path) == [
        "cluster: no peer reachable (rb2)"]  # fmt: skip
    assert problems(lambda: clustered(), tmp_path) == []  # alone in its cluster: nobody to reach

    def unreachable():
        raise Unreachable("no node answers on /x (no such socket)")

    assert problems(unreachable, tmp_path) == ["node: no node answers on /x (no such socket)"]
    hook = tmp_path / "10-broken"
    hook.write_text("#!/bin/sh\necho image says no\nexit 3\n")
    hook.chmod(0o755)
    (tmp_path / "README").write_text("not executable: not a hook")
    assert problems(lambda: READY, tmp_path) == [f"{hook}: exit 3: image says no"]
    assert problems(unreachable, tmp_path)[1:] == [f"{hook}: exit 3: image says no"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waiting_ends_healthy_or_at_the_deadline(tmp_path):
    clock = Clock()
    answers = iter([{"core": {"ready": False}}] * 3 + [READY])
    verdict = wait_healthy(lambda: next(answers), tmp_path, 60, clock, clock.sleep)
    assert verdict.problems == [] and not verdict.definite and clock.now == 6.0
    clock = Clock()
    verdict = wait_healthy(lambda: {"core": {}}, tmp_path, 10, clock, clock.sleep)
    assert verdict.problems == ["node: not ready (a service has not started)"]
    assert not verdict.definite and clock.now == 10.0


def test_a_definite_failure_ends_the_wait_at_once_a_transient_one_does_not(tmp_path):
    def down():
        raise Unreachable("no node answers on /x (no such socket)")

    clock = Clock()
    exits = iter([[], [], ["node: rackboot.service exited 3 times since boot (last: ...)"]])
    verdict = wait_healthy(down, tmp_path, 300, clock, clock.sleep, definite=lambda: next(exits))
    assert verdict.definite and clock.now == 2 * POLL  # the third round: 4 s, not 300 s
    assert verdict.problems == ["node: rackboot.service exited 3 times since boot (last: ...)"]
    clock = Clock()
    verdict = wait_healthy(down, tmp_path, 300, clock, clock.sleep, definite=list)
    assert not verdict.definite and clock.now == 300.0  # the node may still come up


def test_the_service_gave_up_when_failed_or_exiting_again_and_again():
    running = {"ActiveState": "active", "Result": "success", "ExecMainStatus": "0",
               "NRestarts": "0"}  # fmt: skip
    assert service_gave_up(lambda: running) == []
    assert service_gave_up(lambda: {}) == []  # no systemd: nothing to say
    restarting = {"ActiveState": "activating", "Result": "exit-code", "ExecMainStatus": "1"}
    assert service_gave_up(lambda: {**restarting, "NRestarts": "2"}) == []  # may still come up
    assert service_gave_up(lambda: {**restarting, "NRestarts": "3"}) == [
        "node: rackboot.service exited 3 times since boot (exit-code, status 1)"]  # fmt: skip
    between = {"ActiveState": "activating", "Result": "success", "ExecMainStatus": "0"}
    assert service_gave_up(lambda: {**between, "NRestarts": "3"}) == [
        "node: rackboot.service exited 3 times since boot"]  # fmt: skip
    failed = {"ActiveState": "failed", "Result": "exit-code", "ExecMainStatus": "2",
              "NRestarts": "0"}  # fmt: skip
    assert service_gave_up(lambda: failed) == [
        "node: rackboot.service failed (exit-code, status 2); systemd does not restart it"]  # fmt: skip


def test_systemd_show_reads_the_properties():
    def run(argv, **kw):
        assert argv[:3] == ["systemctl", "show", "rackboot.service"]
        out = "ActiveState=failed\nResult=exit-code\nExecMainStatus=2\nNRestarts=4\nOther=x\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    assert systemd_show(run) == {"ActiveState": "failed", "Result": "exit-code",
                                 "ExecMainStatus": "2", "NRestarts": "4"}  # fmt: skip

    def missing(argv, **kw):
        raise FileNotFoundError("systemctl")

    assert systemd_show(missing) == {}


def test_a_configuration_this_version_refuses_is_definite(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(f'[node]\ndata_dir = "{tmp_path / "data"}"\n')
    assert refused_configuration(str(good)) == []
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[node]\ndata_dir = "{tmp_path / "data"}"\n[dhcp]\nlease_tme = 60\n')
    (refusal,) = refused_configuration(str(bad))
    assert refusal.startswith(f"configuration refused by this version: {bad}: dhcp.lease_tme")


class TrialSlot:
    """Firmware booted from slot b on trial (what cmd_health asks of it)."""

    def __init__(self) -> None:
        self.verdicts: list[bool] = []

    def booted(self) -> str:
        return "b"

    def state(self):
        return {"b": SimpleNamespace(good=False)}

    def judge(self, healthy: bool) -> bool:
        self.verdicts.append(healthy)
        return not healthy


def test_the_command_marks_a_slot_bad_at_once_for_a_refused_configuration(
    tmp_path, monkeypatch, capsys
):
    config = tmp_path / "rackboot.toml"
    config.write_text(f'[node]\ndata_dir = "{tmp_path / "data"}"\n'
                      '[firmware]\nhealth_timeout = 3600.0\n[dhcp]\nlease_tme = 60\n')  # fmt: skip
    slot = TrialSlot()
    monkeypatch.setattr(commands, "firmware_of", lambda args: slot)
    slept: list[float] = []
    monkeypatch.setattr(health.time, "sleep", slept.append)
    code = main(["firmware", "health", "--config", str(config), "--no-reboot"])
    out, err = capsys.readouterr()
    assert (code, slot.verdicts, slept) == (1, [False], [])  # judged without waiting
    assert "unhealthy (for good: not waiting): configuration refused by this version" in err
    assert "slot b marked bad" in out
