"""The health check of a slot on trial: node ready, a peer reachable, hooks exit 0."""

from __future__ import annotations

from appliance.errors import Unreachable
from appliance.firmware.health import problems, wait_healthy

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


def test_waiting_ends_healthy_or_at_the_deadline(tmp_path):
    now = [0.0]
    answers = iter([{"core": {"ready": False}}] * 3 + [READY])
    assert wait_healthy(lambda: next(answers), tmp_path, 60, lambda: now[0],
                        lambda s: now.__setitem__(0, now[0] + s)) == []  # fmt: skip
    assert now[0] == 6.0
    now[0] = 0.0
    found = wait_healthy(lambda: {"core": {}}, tmp_path, 10, lambda: now[0],
                         lambda s: now.__setitem__(0, now[0] + s))  # fmt: skip
    assert found == ["node: not ready (a service has not started)"] and now[0] == 10.0
