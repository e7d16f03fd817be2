"""The ``ra`` plugin on a real link (docs/ra.md): a host's router solicitation gets
Rackboot's router advertisement with router lifetime 0, and another router on the
link, there at start or appearing later, makes Rackboot stay quiet.

The host side is scapy (tests/support/ndp_probe.py): it solicits from its own
link-local address and reports every advertisement it hears; a third lab host plays
a real router (router lifetime 1800 and a prefix, every 0.3 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dhcplab import DhcpNode, wait_until
from tests.support.netns import Host, Lab

REPO = Path(__file__).resolve().parents[2]
LISTEN = 1.0  # [ra] listen: seconds Rackboot listens for routers at start
ROUTER_SECONDS = 20.0  # the scapy router's own bound


def probe(host: Host, mode: str, seconds: float) -> list[str]:
    return [sys.executable, "-m", "tests.support.ndp_probe", mode, host.ifname, str(seconds)]


def solicit(host: Host, seconds: float = 1.5) -> tuple[dict, list[dict]]:
    """The soliciting host's address, and every RA it heard within ``seconds``."""
    res = host.run(probe(host, "solicit", seconds), cwd=REPO, timeout=30)
    assert res.returncode == 0, res.stderr
    first, *rest = (json.loads(line) for line in res.stdout.splitlines())
    return first, rest


def start_router(host: Host) -> str:
    """A router advertising on the link; its link-local address once it has started."""
    proc = host.popen(probe(host, "router", ROUTER_SECONDS), cwd=REPO, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded: the probe exits within its DAD wait
    assert line, proc.stderr.read() if proc.stderr else "router probe died"
    return json.loads(line)["address"]


@pytest.fixture
def node(lab: Lab, tmp_path: Path) -> Iterator[DhcpNode]:
    srv = lab.add_host("srv")
    net = lab.network.network_address
    made = DhcpNode(srv, tmp_path / "node", f"""
        [[dhcp.subnets]]
        network = "{lab.network}"
        pools = ["{net + 100}-{net + 150}"]
        [ra]
        listen = {LISTEN}
        """)  # fmt: skip
    yield made
    if made.proc is not None and made.proc.poll() is None:
        made.stop()


def ra_state(node: DhcpNode) -> dict:
    return node.status()["ra"]["interfaces"][node.host.ifname]


def wait_state(node: DhcpNode, state: str, timeout: float = 15.0) -> dict:
    return wait_until(lambda: (s := ra_state(node))["state"] == state and s, timeout,
                      f"ra state {state}", detail=lambda: f"{ra_state(node)}\n{node.log_text()}")  # fmt: skip


def ours(node: DhcpNode, heard: list[dict]) -> list[dict]:
    return [ra for ra in heard if ra["lladdr"] == node.host.mac]


def test_a_solicitation_gets_an_advertisement_that_routes_nothing(lab: Lab, node) -> None:
    cli = lab.add_host("cli")
    node.start()
    wait_state(node, "answering")  # after listening LISTEN s and hearing no router
    me, heard = solicit(cli)
    mine = ours(node, heard)  # the host's kernel may have solicited too: one answer or more
    assert mine, heard
    for ra in mine:
        assert ra["src"].startswith("fe80:") and ra["hlim"] == 255
        assert ra["dst"] == me["address"]  # answered to the host alone (RFC 4861 §6.2.6)
        assert (ra["lifetime"], ra["M"], ra["O"]) == (0, 0, 0)
        assert ra["options"] == ["ICMPv6 Neighbor Discovery Option - Source Link-Layer Address"]
    status = ra_state(node)
    assert status["answered"] >= 1 and status["dropped"] == {}
    # The host's kernel took the advertisement and made us no default router.
    routes = cli.run(["ip", "-6", "route", "show", "default"], check=True).stdout
    assert routes.strip() == ""


def test_quiet_beside_a_router_there_at_start(lab: Lab, node) -> None:
    cli, rtr = lab.add_host("cli"), lab.add_host("rtr")
    router = start_router(rtr)
    node.start()
    status = wait_state(node, "quiet")
    assert status["router"] == router and status["answered"] == 0
    _, heard = solicit(cli)
    assert [ra["src"] for ra in heard if ra["lifetime"] == 1800]  # the router is heard
    assert ours(node, heard) == []
    assert ra_state(node)["not_answered"] >= 1


def test_falls_quiet_when_a_router_appears(lab: Lab, node) -> None:
    cli, rtr = lab.add_host("cli"), lab.add_host("rtr")
    node.start()
    wait_state(node, "answering")
    assert ours(node, solicit(cli)[1])
    router = start_router(rtr)
    assert wait_state(node, "quiet")["router"] == router
    assert ours(node, solicit(cli)[1]) == []
