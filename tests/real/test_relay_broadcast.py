"""Broadcast replies through Rackboot's relay: as frames through a packet socket, and
through ``sendmsg`` when the relay has no CAP_NET_RAW (plugins/relay/linklayer.py).

One client link behind relay_lab's router; the client (udhcpc ``-B``) asks for
broadcast replies, so every OFFER and ACK is broadcast on its link. Both ways must
reach it (udhcpc checks the IPv4 and UDP checksums of what it takes), from the relay's
address and MAC (the MAC it has now: changed while the relay runs), without option 82. What tells the two ways apart is a UDP socket on
port 68 in the relay's own namespace: the kernel loops a copy of every broadcast sent
through the IP stack back to local sockets, and none of a frame a packet socket sent.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tests.support.dhcplab import DhcpNode, Sniffer, Udhcpc, bootp_fields, dhcp_options
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
def test_broadcast_replies_reach_a_real_client(lab: Lab, tmp_path: Path, way: str) -> None:
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
        sniffer = Sniffer(down, tmp_path)

        client_host = router.links[0].add_host("cli", bare=True)
        client = Udhcpc(client_host, tmp_path / "cli", extra=("-B",)).start()
        assert_bound_in_their_subnets(router, [client], BOUND_TIMEOUT)
        client.stop()
        macs = [down.mac]
        if way == "frames":  # the kernel writes the MAC the interface has now
            down.run(["ip", "link", "set", "dev", down.ifname, "address", NEW_MAC], check=True)
            macs.append(NEW_MAC)
            again = Udhcpc(client_host, tmp_path / "again", extra=("-B",)).start()
            assert_bound_in_their_subnets(router, [again], BOUND_TIMEOUT)
            again.stop()
        frames = sniffer.stop()
        copies = looped.stop()

        replies = [f for f in frames if f["dir"] == "out" and f["dport"] == 68]
        kinds = {bootp_fields(f["payload"])["type"] for f in replies}
        assert {OFFER, ACK} <= kinds, replies
        for frame in replies:
            assert (frame["dst_mac"], frame["dst"]) == ("ff:ff:ff:ff:ff:ff", "255.255.255.255")
            assert (frame["src"], frame["sport"]) == (down.addr, 67), frame
            assert bootp_fields(frame["payload"])["flags"] & 0x8000, frame
            assert RELAY_AGENT_INFO not in dhcp_options(frame["payload"]), frame
        # from the interface's MAC, the new one once it changed
        sources = [f["src_mac"] for f in replies]
        assert sources == sorted(sources, key=macs.index) and set(sources) == set(macs), (
            macs, sources)  # fmt: skip
        status = relay.relay_status()
        assert status["interfaces"][down.ifname]["broadcast_frames"] == (way == "frames")
        assert status["frames_refused"] == 0 and status["send_errors"] == 0, status
        assert not status["dropped"], status
        if way == "frames":
            assert copies == [], "a broadcast reply went through the IP stack"
        else:  # the kernel's looped-back copy of each broadcast reply
            assert len(copies) >= len(replies), (copies, replies)
            assert {c.split()[0] for c in copies} == {down.addr}
        relay.stop()
        node.stop()
