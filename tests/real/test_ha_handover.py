"""A graceful hand-over (`rackboot ha handover`) of a real rack: two appliances and a
witness in network namespaces, a probe doing a relay-style DORA every 5 ms from the
client's namespace. DHCP is answered across the hand-over with a gap of milliseconds
(one round of the successor, not a lease's expiry), and never by both appliances.
Run from the active, then from the standby (which asks the active)."""

from __future__ import annotations

import time

import pytest

from tests.support.dhcplab import wait_until
from tests.support.dora_probe import DoraProbe, switch_gap

PERIOD = 0.005


def other(name: str) -> str:
    return "b" if name == "a" else "a"


@pytest.mark.parametrize("where", ["active", "standby"])
def test_a_hand_over_keeps_dhcp_answered_with_a_gap_of_milliseconds(probed_rack, tmp_path, where):
    rack = probed_rack
    old = rack.actives()[0]
    new = other(old)
    epoch = rack.nodes[old].ha()["epoch"]
    with DoraProbe(rack, tmp_path / "probe.jsonl", PERIOD) as probe:
        wait_until(lambda: any(w == old for _, w in probe.answers("ack")), 10,
                   "the probe's leases acknowledged by the active", detail=rack.logs)  # fmt: skip
        wait_until(rack.settled, 10, "the standby caught up", detail=rack.logs)
        asked = time.monotonic()
        rack.nodes[old if where == "active" else new].cli("ha", "handover")
        wait_until(lambda: rack.actives() == [new], 5, "the hand-over", detail=rack.logs)
        wait_until(lambda: any(w == new for t, w in probe.answers("ack") if t > asked), 5,
                   "an ACK from the new active (its first commits)", detail=rack.logs)  # fmt: skip
        time.sleep(0.3)
        offers = probe.answers("offer")
        silence = probe.longest_silence(asked, time.monotonic() - 0.05)
    gap = switch_gap(offers, old, new, asked)
    print(f"hand-over from the {where}: OFFER gap {gap * 1000:.1f} ms, longest silence "
          f"{silence * 1000:.1f} ms (a DISCOVER every {PERIOD * 1000:.0f} ms)")  # fmt: skip
    assert gap < 0.15, f"the hand-over left DHCP unanswered for {gap:.3f} s"
    assert silence < 0.2
    ha = rack.nodes[new].ha()
    assert ha["epoch"] == epoch + 1  # one change of holder, no failover in between
    assert rack.nodes[old].ha()["last_change"] == f"lost epoch {epoch}: handover"
    assert ha["transitions"]["acquired"] == 1
    wait_until(lambda: rack.has_vip(new) and not rack.has_vip(old), 3, "the VIP moved")
