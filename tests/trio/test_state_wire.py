"""Frames injected on the replication port of a real active node: a cluster member that is
not one of the rack's appliances, garbage, a frame signed by another key, one naming another
signer, and a valid follower's out-of-turn messages are refused and counted by reason; the
active keeps serving its real standby."""

from __future__ import annotations

import trio

from appliance.cluster import pki
from appliance.cluster.transport import client_context
from appliance.ha.witness import load_identity
from appliance.state.service import LENGTH
from appliance.state.signing import seal
from tests.trio.test_cluster import wait_until
from tests.trio.test_ha import actives, rack


async def connect(node, identity) -> trio.SSLStream:
    port = node.replication.port
    tcp = await trio.open_tcp_stream("127.0.0.1", port)
    stream = trio.SSLStream(tcp, client_context(identity), server_hostname=None)
    await stream.do_handshake()
    return stream


async def send_frame(stream: trio.SSLStream, frame: bytes) -> bool:
    """Send one frame; True if the active hung up on us afterwards."""
    await stream.send_all(LENGTH.pack(len(frame)) + frame)
    with trio.move_on_after(2):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        return True
    return False


async def test_injected_frames_are_refused_and_counted(tmp_path):
    async with rack(tmp_path) as (nodes, witness):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        active = nodes[actives(nodes)[0]]
        standby = next(n for n in nodes.values() if n is not active)
        await wait_until(lambda: active.replication.followers, what="the standby to follow")
        me = standby.cluster.identity  # a rack appliance's certificate, for the TLS link
        # a member of the cluster that is not one of the rack's appliances
        stranger = load_identity(str(tmp_path / "w"))
        stream = await connect(active, stranger)
        assert await send_frame(stream, seal(["hello", 0, 0], stranger.key, stranger.node_id))
        cases = [
            b"\x00garbage",  # not a signed frame
            seal(["hello", 0, 0], pki.new_key(), me.node_id),  # someone else's key
            seal(["hello", 0, 0], me.key, "f" * 16),  # naming another signer
            seal(["ack", 5], me.key, me.node_id),  # out of turn
            seal(["hello", 99, 1], me.key, me.node_id),  # from a newer epoch than the leader's
        ]
        for frame in cases:
            stream = await connect(active, me)
            assert await send_frame(stream, frame), frame[:20]
        refused = active.replication.status()["refused"]
        assert refused.get("stranger") == 1
        assert refused.get("malformed") == 1
        assert refused.get("signature") == 1
        assert refused.get("unknown-key") == 1
        assert refused.get("unexpected") == 1
        assert refused.get("newer-epoch") == 1
        # the real standby still follows and gets what is written
        await active.state.put("ns", "k", 1)
        await wait_until(lambda: standby.state.get("ns", "k") == 1, what="the standby")


async def test_a_standbys_newest_link_replaces_its_old_one(tmp_path):
    """A redial (the old TCP link not yet seen dead) must not leave the active with two
    streams for one standby, nor drop the live one when the old one ends."""
    async with rack(tmp_path) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        active = nodes[actives(nodes)[0]]
        standby = next(n for n in nodes.values() if n is not active)
        peer = standby.cluster.identity.node_id
        await wait_until(lambda: peer in active.replication.followers, what="a follower")
        first = active.replication.followers[peer]
        standby.replication.following = {}
        stream = await connect(active, standby.cluster.identity)  # a second link, same standby
        await stream.send_all(b"")
        await wait_until(lambda: active.replication.followers.get(peer) is not first,
                         what="the newest link to win")  # fmt: skip
        await stream.aclose()
        # the standby redials after its old link was cancelled and follows again
        await wait_until(lambda: peer in active.replication.followers
                         and active.replication.followers[peer].stage == "stream",
                         what="the standby back")  # fmt: skip
        await active.state.put("ns", "k", 2)
        await wait_until(lambda: standby.state.get("ns", "k") == 2, what="replication")
