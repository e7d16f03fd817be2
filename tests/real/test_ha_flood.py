"""Junk on the election's port does not starve the holder's renewals or DHCP.

Two appliances and a witness in namespaces (tests/support/ha_lab.py); a fifth
namespace floods the three election ports for a bounded time with what an
outsider can send (tests/support/ha_flood.py: garbage, envelopes signed by a
forged CA carrying the real CA's name, a new certificate each time, from
spoofed source addresses). Meanwhile the holder must keep its schedule (no
step-down, every renewal landing with most of the lease left), a DHCP client
must get a lease from it, and the junk must be counted as dropped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import ha_flood
from tests.support.dhcplab import Udhcpc
from tests.support.ha_lab import PORT, Rack
from tests.support.netns import Lab, have_commands

pytestmark = pytest.mark.skipif(not have_commands("udhcpc"), reason="needs busybox udhcpc")

RATE = 6000  # datagrams/s over the three ports: 2,000/s each
SECONDS = 6.0


def start_flood(rack: Rack, lab: Lab, tmp_path: Path) -> subprocess.Popen:
    attacker = lab.add_host("x")
    targets = ",".join(f"{rack.hosts[n].addr}:{PORT}" for n in ("a", "b", "w"))
    ca = tmp_path / "a" / "data" / "cluster" / "ca.crt"
    if not ca.exists():
        ca = next((tmp_path / "a" / "data").rglob("ca.crt"))
    return attacker.popen(
        [sys.executable, "-m", "tests.support.ha_flood", "--targets", targets,
         "--rate", str(RATE), "--seconds", str(SECONDS), "--ca", str(ca),
         "--spoof", str(lab.network)],
        stdout=subprocess.PIPE, text=True, cwd=Path(ha_flood.__file__).parents[2],
    )  # fmt: skip


def test_a_flood_of_junk_neither_stops_renewals_nor_dhcp(rack, lab, tmp_path):
    holder = rack.actives()[0]
    node = rack.nodes[holder]
    before = node.ha()
    flood = start_flood(rack, lab, tmp_path)
    started = time.monotonic()
    client = Udhcpc(rack.client, tmp_path / "client").start()
    lowest, samples = float("inf"), 0
    while flood.poll() is None and time.monotonic() - started < SECONDS + 30:
        ha = node.ha()
        if ha is not None:
            samples += 1
            assert ha["role"] == "active", f"the holder stepped down under the flood: {ha}"
            lowest = min(lowest, ha["valid_for"])
        time.sleep(0.05)
    out, _ = flood.communicate(timeout=30)
    sent = json.loads(out)["sent"]
    bound = client.wait("bound", timeout=15)
    after = node.ha()
    renewals = after["renewals"] - before["renewals"]
    dropped = sum(after["transport"]["dropped"].values()) - sum(
        before["transport"]["dropped"].values()
    )
    print(f"flood: {sent} datagrams in {SECONDS} s; holder renewed {renewals} times, "
          f"lowest validity seen {lowest:.3f} s, at a renewal {after['lowest_left']} s; "
          f"dropped {after['transport']['dropped']}")  # fmt: skip
    assert sent >= RATE * SECONDS * 0.8
    assert rack.actives() == [holder]
    assert after["epoch"] == before["epoch"] and after["transitions"]["lost"] == 0
    # renewals kept their schedule: about one per `renew` (0.25 s), each with most of the
    # lease (0.85 s usable) left when it landed
    assert renewals >= SECONDS / 0.25 * 0.8
    assert after["lowest_left"] > 0.4 and lowest > 0.4
    assert samples > SECONDS / 0.05 / 4  # the control socket answered throughout
    assert bound["ip"]
    assert dropped > sent / 3 * 0.5  # the holder's third, mostly counted (some lost in queues)
    client.stop()
