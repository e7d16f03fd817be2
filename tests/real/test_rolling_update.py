"""The rolling update of a real rack (docs/updates.md): two appliances and a witness in
network namespaces, each with the test updater (tests/support/roll_updater.py: A/B
slots in a file, a restart that re-executes the node's process), a probe doing a
relay-style DORA every 10 ms from the client's namespace throughout.

* `rackboot firmware roll` run on the standby: the standby updates and restarts,
  rejoins and catches up, the lease is handed over (one change of holder, no
  failover), the other updates; both end on the new version; DHCP never stops
  for more than a moment and is never answered by both;
* a bundle whose health check fails on the first appliance: the roll stops, says
  why, and that appliance is back on its old version; the holder never changed."""

from __future__ import annotations

import json
import time

import pytest

from appliance import control
from appliance.errors import RackbootError
from tests.support.dhcplab import REPO, rackboot, wait_until
from tests.support.dora_probe import DoraProbe
from tests.support.ha_lab import Rack
from tests.support.roll_updater import write_distribution

TIMEOUT = 120  # s per appliance; a restart here takes a few seconds


@pytest.fixture
def rolling_rack(lab, tmp_path, monkeypatch):
    # the nodes' processes (and the CLI's) find the test updater through its entry point
    plugins = write_distribution(tmp_path / "plugins")
    monkeypatch.setenv("PYTHONPATH", f"{plugins}:{REPO}")
    rack = Rack(lab, tmp_path, client_addr=True, cluster_links=True,
                dhcp='[test_updater]\nversion = "1.0"\n')  # fmt: skip
    try:
        yield rack.start()
    finally:
        rack.close()


def roles(rack) -> tuple[str, str, int]:
    """The active, the standby and the epoch of the active's lease."""
    active = rack.actives()[0]
    return active, "b" if active == "a" else "a", rack.nodes[active].ha()["epoch"]


def roll_status(rack, name: str) -> dict | None:
    try:
        return control.call(rack.nodes[name].socket, "roll.status", timeout=2.0)
    except RackbootError:
        return None  # restarting


def bundle(tmp_path, version: str, health: str = "ok"):
    path = tmp_path / f"{version}.bundle"
    path.write_text(json.dumps({"version": version, "health": health}))
    return path


def roll(rack, where: str, path) -> tuple[int, str]:
    """`rackboot firmware roll` on appliance ``where``, waiting until the roll ends."""
    node = rack.nodes[where]
    res = node.host.run(
        rackboot("firmware", "roll", str(path), "--timeout", str(TIMEOUT), "--config",
                 str(node.config)),
        timeout=4 * TIMEOUT,
    )  # fmt: skip
    return res.returncode, res.stdout + res.stderr


def versions(rack) -> dict[str, str]:
    return {n: (roll_status(rack, n) or {}).get("firmware", {}).get("version") for n in rack.nodes}


def test_a_roll_from_the_standby_updates_both_with_one_hand_over_and_dhcp_answered(
    rolling_rack, tmp_path
):
    rack = rolling_rack
    old, new, epoch = roles(rack)
    assert versions(rack) == {"a": "1.0", "b": "1.0"}
    with DoraProbe(rack, tmp_path / "probe.jsonl", 0.01) as probe:
        wait_until(lambda: any(w == old for _, w in probe.answers("ack")), 10,
                   "the probe's leases acknowledged", detail=rack.logs)  # fmt: skip
        started = time.monotonic()
        code, out = roll(rack, new, bundle(tmp_path, "2.0"))
        ended = time.monotonic()
        time.sleep(0.5)
        offers = probe.answers("offer")
        silence = probe.longest_silence(started, ended)
    print(out)
    print(f"roll took {ended - started:.1f} s; longest DHCP silence {silence * 1000:.0f} ms")
    assert code == 0, out + rack.logs()
    assert "roll " in out and ": done" in out
    wait_until(lambda: versions(rack) == {"a": "2.0", "b": "2.0"}, 30, "both on 2.0",
               detail=rack.logs)  # fmt: skip
    # one change of holder, by hand-over: the old standby holds the next epoch
    assert rack.actives() == [new]
    ha = rack.nodes[new].ha()
    assert ha["epoch"] == epoch + 1, ha
    # ... given up by a hand-over (a stop's release would say "released", an expiry
    # "expired"), and taken once
    lost = [line for line in rack.nodes[old].log_text().splitlines() if "lease lost" in line]
    assert len(lost) == 1 and "reason=handover" in lost[0], lost
    assert rack.nodes[new].log_text().count("lease acquired") == 1
    record = roll_status(rack, new)["roll"]
    assert record["state"] == "done" and record["order"] == [rack.ids[new], rack.ids[old]]
    assert {e["state"] for e in record["nodes"].values()} == {"updated"}
    # DHCP answered throughout: by one appliance at a time, never silent for long
    assert silence < 1.0, f"DHCP unanswered for {silence:.3f} s during the roll"
    first_new = min(t for t, who in offers if who == new and t > started)
    assert not [t for t, who in offers if who == old and t > first_new + 0.01]


def test_a_failed_health_check_stops_the_roll_and_the_appliance_is_back_on_its_version(
    rolling_rack, tmp_path
):
    rack = rolling_rack
    holder, standby, epoch = roles(rack)
    code, out = roll(rack, holder, bundle(tmp_path, "2.0", "fail: the DHCP server did not start"))
    print(out)
    assert code != 0, out
    assert "failed" in out and "its health check failed on 2.0, it rolled back" in out
    assert "the DHCP server did not start" in out
    wait_until(lambda: versions(rack)[standby] == "1.0", 30, "the standby back on 1.0",
               detail=rack.logs)  # fmt: skip
    state = roll_status(rack, standby)
    assert state["firmware"]["failed"] == "2.0" and not state["firmware"]["trial"]
    assert versions(rack)[holder] == "1.0"  # never asked
    assert rack.actives() == [holder] and rack.nodes[holder].ha()["epoch"] == epoch
    record = roll_status(rack, holder)["roll"]
    assert record["state"] == "failed"
    assert record["nodes"][rack.ids[standby]]["state"] == "rolled back"
