"""``kill -9`` the node while ACKs are going out: every ACKed lease survives the restart.

dhclient binds first; then a load client (tests/support/dhcp_load.py) runs
many DORA exchanges at once and prints each ACK the moment it arrives; the
node is SIGKILLed as soon as enough have been seen, with more in flight. An
ACK leaves only after its lease record committed in the state log
(``<data_dir>/state/log``, fdatasync'ed by its group commit), so after a restart
every ACK the clients saw must be in ``rackboot leases list``, and each
client's INIT-REBOOT for its address must be ACKed (not NAKed: the server is
authoritative, so a forgotten lease would be refused).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.support.dhcplab import REPO, Dhclient, DhcpNode, read_line
from tests.support.netns import Lab

CLIENTS = 120
KILL_AFTER = 40  # ACKs seen


def test_kill_9_right_after_acks_loses_no_lease(lab: Lab, tmp_path: Path) -> None:
    server = lab.add_host("srv")
    load = lab.add_host("load")  # has an address outside the pool
    net = lab.network.network_address
    node = DhcpNode(
        server,
        tmp_path / "node",
        f"""
        lease_time = 600
        authoritative = true
        [[dhcp.subnets]]
        network = "{lab.network}"
        pools = ["{net + 100}-{net + 250}"]
        """,
    ).start()
    dhclient = Dhclient(lab.add_host("cli", bare=True), tmp_path / "dhclient").start()
    real = dhclient.wait_bound()["new_ip_address"]
    dhclient.stop()  # SIGTERM: it keeps its lease file for the INIT-REBOOT below

    dora = load.popen(
        [sys.executable, "-m", "tests.support.dhcp_load", load.ifname, "dora", str(CLIENTS), "20"],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    acked: list[tuple[str, str]] = []
    deadline = time.monotonic() + 20
    while len(acked) < KILL_AFTER and (line := read_line(dora, deadline - time.monotonic())):
        if line.startswith("ack "):
            _, mac, address = line.split()
            acked.append((mac, address))
    node.kill9()
    killed_after = len(acked)
    out, _ = dora.communicate(timeout=15)  # closes its stdin: it stops and prints the rest
    acked += [tuple(line.split()[1:]) for line in out.splitlines() if line.startswith("ack ")]
    assert killed_after == KILL_AFTER, f"only {killed_after} ACKs before the deadline"
    assert len(set(acked)) == len(acked) and len({a for _, a in acked}) == len(acked)

    node.start()
    listed = {(x["mac"], x["address"]) for x in node.cli("leases", "list")}
    lost = [pair for pair in acked if pair not in listed]
    assert not lost, f"{len(lost)} of {len(acked)} ACKed leases lost: {lost[:5]}"
    assert (dhclient.host.mac, real) in listed

    # INIT-REBOOT: each load client asks for its address again, without a server id.
    reboot = load.run(
        [sys.executable, "-m", "tests.support.dhcp_load", load.ifname, "reboot", "10"],
        cwd=REPO, input="".join(f"{mac} {address}\n" for mac, address in acked), timeout=30,
    )  # fmt: skip
    verdicts = [line.split() for line in reboot.stdout.splitlines() if line != "done"]
    assert sorted(v[1:] for v in verdicts) == sorted(list(pair) for pair in acked), reboot.stderr
    assert {v[0] for v in verdicts} == {"ack"}, [v for v in verdicts if v[0] != "ack"][:5]

    # dhclient, run again with its lease file, does the same: REBOOT, not a new DORA.
    before = len(dhclient.events.all())
    dhclient.start()
    event = dhclient.wait_bound(("REBOOT", "BOUND"), after=before)
    assert (event["event"], event["new_ip_address"]) == ("REBOOT", real)
    state = node.status()["core"]["state"]
    assert state["write_failures"] == 0 and state["problem"] == "" and state["lsn"] >= len(acked)
    assert not (node.data / "dhcp" / "leases.journal").exists()  # nothing of the old journal
    dhclient.stop()
    node.stop()
