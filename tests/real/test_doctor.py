"""``rackboot doctor`` against real nodes in namespaces (tests/support/netns.py).

The probe: a Rackboot node serves a link; ``rackboot doctor --dhcp-probe IFACE`` runs in
a client namespace on that link (the node's control socket is a file: the doctor also
reads its status there). With the node alone, its offer is listed as this rack's and
the probe passes; with a dnsmasq planted on the link, both are listed and dnsmasq is
flagged foreign (exit 7).

The rack: two appliances and a witness (tests/support/ha_lab.py, linked over the
cluster too); the doctor on each sees its peers and the witness heard, the lease held,
replication streaming, the clock skew measured; once the witness stops, it fails the
witness check within the stale window.
"""

from __future__ import annotations

import json
import subprocess
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from tests.support.dhcplab import DhcpNode, rackboot, stop_process, wait_until
from tests.support.ha_lab import Rack
from tests.support.netns import Host, Lab, have_commands

pytestmark = pytest.mark.skipif(
    not have_commands("ip", "ss", "dnsmasq"), reason="needs iproute2 and dnsmasq (dnsmasq-base)"
)
pytest.importorskip("scapy", reason="the probe needs scapy (the dev extra)")

EXIT_FAIL, EXIT_WARN = 7, 6


def doctor(host: Host, config: Path, *args: str) -> tuple[int, dict]:
    res = host.run(rackboot("doctor", "--json", "--config", str(config), *args), timeout=60)
    assert res.stdout, res.stderr
    return res.returncode, json.loads(res.stdout)


def by_check(report: dict) -> dict[str, dict]:
    return {c["check"]: c for c in report["checks"]}


def plant_dnsmasq(host: Host, workdir: Path) -> subprocess.Popen:
    """dnsmasq as a DHCP server only on ``host``'s link, its own pool."""
    workdir.mkdir(parents=True, exist_ok=True)
    net = host.network
    conf = workdir / "dnsmasq.conf"
    conf.write_text("\n".join([
        "port=0", f"interface={host.ifname}", "bind-interfaces", "no-resolv", "no-hosts",
        "no-ping", "user=root", f"dhcp-leasefile={workdir / 'leases'}",
        f"pid-file={workdir / 'pid'}", f"log-facility={workdir / 'dnsmasq.log'}",
        f"dhcp-range={net.network_address + 170},{net.network_address + 180},{net.netmask},600",
    ]) + "\n")  # fmt: skip
    proc = host.popen(["dnsmasq", "--keep-in-foreground", f"--conf-file={conf}"],
                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)  # fmt: skip

    def listening() -> bool:
        assert proc.poll() is None, f"dnsmasq exited {proc.returncode}"
        res = host.run(["ss", "-H", "-uln", "sport = :67"])
        return bool(res.stdout.strip())

    wait_until(listening, 10, "dnsmasq on UDP 67")
    return proc


@pytest.fixture
def served_link(lab: Lab, tmp_path: Path):
    """A node serving DHCP on the lab link, and a bare client host on it."""
    server = lab.add_host("s")
    client = lab.add_host("c", bare=True)
    net = lab.network
    node = DhcpNode(server, tmp_path / "node", f"""
        [[dhcp.subnets]]
        network = "{net}"
        pools = ["{net.network_address + 100}-{net.network_address + 150}"]
        router = "{net.network_address + 1}"
        """).start()  # fmt: skip
    try:
        yield node, client
    finally:
        node.stop()


def test_the_probe_lists_the_appliance_alone_and_passes(served_link):
    node, client = served_link
    code, report = doctor(client, node.config, "--dhcp-probe", client.ifname)
    checks = by_check(report)
    probe = checks["dhcp.probe"]
    assert probe["verdict"] == "pass", probe
    [answer] = probe["data"]["answers"]
    assert answer["server_id"] == node.host.addr and answer["source_mac"] == node.host.mac
    assert answer["kind"] == "OFFER" and IPv4Address(answer["offered"]) in node.host.network
    # the node's own checks ran too, through its control socket: no failure anywhere
    assert report["node"] == "dhcp-node" and checks["ports"]["verdict"] == "pass"
    assert code in (0, EXIT_WARN) and "fail" not in {c["verdict"] for c in report["checks"]}
    # the offer reserved nothing on the node: a probe leaves no lease behind
    assert node.leases(all=True) == []


def test_the_probe_finds_a_planted_dnsmasq_and_flags_it_foreign(served_link, lab, tmp_path):
    node, client = served_link
    rogue = lab.add_host("r")
    plant_dnsmasq(rogue, tmp_path / "rogue")
    code, report = doctor(client, node.config, "--dhcp-probe", client.ifname, "--timeout", "3")
    probe = by_check(report)["dhcp.probe"]
    answers = {a["server_id"]: a for a in probe["data"]["answers"]}
    assert set(answers) == {node.host.addr, rogue.addr}, probe
    assert answers[rogue.addr]["source_mac"] == rogue.mac
    assert answers[rogue.addr]["offered"].rpartition(".")[2] in map(str, range(170, 181))
    assert probe["verdict"] == "fail" and code == EXIT_FAIL
    assert rogue.addr in probe["summary"] and node.host.addr not in probe["summary"]
    rows = {line.split()[0]: line for line in probe["details"]}
    assert rows[rogue.addr].endswith("FOREIGN: not this rack")
    assert not rows[node.host.addr].endswith("FOREIGN: not this rack")
    # the text report says the same in one FAIL line, naming dnsmasq's MAC
    text = client.run(rackboot("doctor", "--config", str(node.config), "--dhcp-probe",
                               client.ifname, "--timeout", "2"), timeout=60).stdout  # fmt: skip
    [line] = [line for line in text.splitlines() if line.startswith("FAIL  dhcp.probe")]
    assert rogue.mac in line
    # an operator who says the server belongs: the probe passes again
    code, report = doctor(client, node.config, "--dhcp-probe", client.ifname, "--timeout", "2",
                          "--known-server", rogue.addr)  # fmt: skip
    assert by_check(report)["dhcp.probe"]["verdict"] == "pass"


@pytest.fixture
def linked_rack(lab: Lab, tmp_path: Path):
    made = Rack(lab, tmp_path, cluster_links=True)
    try:
        yield made.start()
    finally:
        made.close()


def test_the_rack_checks_on_both_appliances_and_a_lost_witness(linked_rack):
    rack = linked_rack
    wait_until(lambda: all(_skews_measured(rack, n) for n in rack.nodes), 15, "skews measured")
    [active] = rack.actives()
    for name, node in rack.nodes.items():
        code, report = doctor(node.host, node.config)
        checks = by_check(report)
        for check in ("node", "services", "ports", "cluster.links", "ha.peers", "ha.witnesses",
                      "ha.lease", "state.log", "state.replication", "time.skew"):  # fmt: skip
            assert checks[check]["verdict"] == "pass", (name, checks[check])
        assert ("holds the rack's lease" in checks["ha.lease"]["summary"]) == (name == active)
        assert code in (0, EXIT_WARN), report
    # the witness stops: every appliance fails the witness check once it is stale
    stop_process(rack.witness)
    node = rack.nodes[active]

    def witness_lost() -> bool:
        return by_check(doctor(node.host, node.config)[1])["ha.witnesses"]["verdict"] == "fail"

    wait_until(witness_lost, 20, "the doctor fails the lost witness")
    code, report = doctor(node.host, node.config)
    assert code == EXIT_FAIL and rack.ids["w"] in by_check(report)["ha.witnesses"]["summary"]


def _skews_measured(rack: Rack, name: str) -> bool:
    site = rack.nodes[name].status()["core"]["cluster"].get("site", [])
    return any(row.get("clock_skew") is not None for row in site if not row.get("self"))
