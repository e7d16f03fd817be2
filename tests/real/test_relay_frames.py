"""Replies through Rackboot's relay as frames through a packet socket, and through
``sendmsg`` when the relay has no CAP_NET_RAW (plugins/relay/linklayer.py).

One client link behind relay_lab's router and two clients on it: udhcpc ``-B`` asks
for broadcast replies, plain udhcpc gets its OFFER and ACK by unicast to ``yiaddr``
at its MAC. Both ways must reach both (udhcpc checks the IPv4 and UDP checksums of
what it takes), from the relay's address and MAC, without option 82. Two things tell
the ways apart, in the relay's namespace: a UDP socket on port 68 gets the copy of
each broadcast the kernel loops back to local sockets (none of a frame), and
``ip monitor neigh`` sees the ARP entry ``sendmsg`` needs for each unicast (a frame
needs none).
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from tests.support.dhcplab import (
    DhcpNode,
    Sniffer,
    Udhcpc,
    bootp_fields,
    dhcp_options,
    stop_process,
)
from tests.support.netns import Lab, have_commands
from tests.support.relay_lab import (
    Listener,
    RelayNode,
    assert_bound_in_their_subnets,
    build_router,
    route_via,
    subnets_toml,
)

pytestmark = pytest.mark.skipif(not have_commands("ip", "udhcpc", "setpriv"),
                                reason="needs iproute2, udhcpc, setpriv (util-linux)")  # fmt: skip

RELAY_AGENT_INFO = 82
OFFER, ACK = 2, 5
CAP_NET_RAW = 13
NEW_MAC = "02:5e:00:00:00:18"
BOUND_TIMEOUT = 15.0
# The relay as root without CAP_NET_RAW: the packet socket is refused (EPERM).
WITHOUT_NET_RAW = ("setpriv", "--bounding-set", "-net_raw", "--inh-caps", "-net_raw", "--")


def effective_capabilities(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no CapEff in /proc/{pid}/status")


@pytest.mark.parametrize("way", ["frames", "sendmsg"])
def test_broadcast_and_unicast_replies_reach_real_clients(
    lab: Lab, tmp_path: Path, way: str
) -> None:
    with contextlib.ExitStack() as stack:
        router = build_router(lab, stack, links=1)
        down = router.downs[0]
        srv = lab.add_host("srv")
        route_via(router, srv)
        node = DhcpNode(srv, tmp_path / "server", subnets_toml(router)).start()
        relay = RelayNode(router, tmp_path / "relay", [srv.addr])
        relay.check()
        relay.start(wrapper=WITHOUT_NET_RAW if way == "sendmsg" else ())
        assert relay.proc is not None
        has_net_raw = bool(effective_capabilities(relay.proc.pid) >> CAP_NET_RAW & 1)
        assert has_net_raw == (way == "frames")
        looped = Listener(router.up, tmp_path)
        with (tmp_path / "neigh.txt").open("w") as out:
            neigh = router.up.popen(["ip", "-4", "monitor", "neigh"], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        sniffer = Sniffer(down, tmp_path)

        link = router.links[0]
        hosts = {"broadcast": link.add_host("cliB", bare=True),
                 "unicast": link.add_host("cliU", bare=True)}  # fmt: skip
        macs = {kind: host.mac for kind, host in hosts.items()}

        def bind_both(name: str) -> dict[str, str]:
            """Each client bound in turn: its address."""
            leased = {}
            for kind, host in hosts.items():
                client = Udhcpc(host, tmp_path / f"{name}-{kind}",
                                extra=("-B",) if kind == "broadcast" else ()).start()  # fmt: skip
                (leased[kind],) = assert_bound_in_their_subnets(router, [client], BOUND_TIMEOUT)
                client.stop()
            return leased

        leased = bind_both("first")
        sources = [down.mac]
        if way == "frames":  # the kernel writes the MAC the interface has now
            down.run(["ip", "link", "set", "dev", down.ifname, "address", NEW_MAC], check=True)
            sources.append(NEW_MAC)
            assert bind_both("again") == leased
        frames = sniffer.stop()
        copies = looped.stop()
        stop_process(neigh)

        replies = [f for f in frames if f["dir"] == "out" and f["dport"] == 68]
        for kind, mac in macs.items():
            mine = [f for f in replies if bootp_fields(f["payload"])["yiaddr"] == leased[kind]]
            assert {OFFER, ACK} <= {bootp_fields(f["payload"])["type"] for f in mine}, replies
            for frame in mine:
                fields = bootp_fields(frame["payload"])
                if kind == "broadcast":
                    assert fields["flags"] & 0x8000, frame
                    to = ("ff:ff:ff:ff:ff:ff", "255.255.255.255")
                else:  # RFC 2131 §4.1: no broadcast flag, no ciaddr: yiaddr at chaddr
                    assert not fields["flags"] & 0x8000, frame
                    to = (mac, leased[kind])
                assert (frame["dst_mac"], frame["dst"]) == to, frame
                assert (frame["src"], frame["sport"]) == (down.addr, 67), frame
                assert RELAY_AGENT_INFO not in dhcp_options(frame["payload"]), frame
        # from the interface's MAC, the new one once it changed
        seen = [f["src_mac"] for f in replies]
        assert seen == sorted(seen, key=sources.index) and set(seen) == set(sources), seen

        status = relay.relay_status()
        assert status["interfaces"][down.ifname]["frames"] == (way == "frames")
        assert status["frames_refused"] == 0 and status["send_errors"] == 0, status
        assert not status["dropped"] and status["arp_refused"] == 0, status
        arp = (tmp_path / "neigh.txt").read_text()
        if way == "frames":
            assert copies == [], "a broadcast reply went through the IP stack"
            assert leased["unicast"] not in arp, f"an ARP entry for a unicast reply:\n{arp}"
        else:  # the kernel's looped-back copy of each broadcast, the ARP entry of a unicast
            broadcasts = sum(f["dst"] == "255.255.255.255" for f in replies)
            assert len(copies) >= broadcasts > 0, (copies, replies)
            assert {c.split()[0] for c in copies} == {down.addr}
            assert f"{leased['unicast']} dev {down.ifname} lladdr {macs['unicast']}" in arp, arp
        relay.stop()
        node.stop()
