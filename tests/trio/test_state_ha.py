"""Replication between real nodes over loopback (TLS, signed frames): what the active
writes reaches the standby, which after a hand-over writes on from there; the old active
then follows it."""

from __future__ import annotations

import pytest
import trio

from appliance.api import Role
from tests.trio.test_cluster import wait_until
from tests.trio.test_ha import actives, rack


async def filled(nodes, records: int):
    """Once one is active: (active, standby), the active having written ``records``."""
    await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
    first = actives(nodes)[0]
    active, standby = nodes[first], nodes["b" if first == "a" else "a"]
    for n in range(records):
        await active.state.put("leases", f"10.0.0.{n}", {"n": n})
    return active, standby


async def test_the_standby_follows_the_active_and_takes_over_with_its_state(tmp_path):
    async with rack(tmp_path) as (nodes, _):
        active, standby = await filled(nodes, 20)
        second = next(name for name, node in nodes.items() if node is standby)
        await wait_until(lambda: standby.state.position == active.state.position,
                         what="the standby to catch up")  # fmt: skip
        assert standby.state.tables.data == active.state.tables.data
        follower = active.replication.status()["followers"][standby.cluster.identity.node_id]
        assert follower["stage"] == "stream" and follower["lag"] == 0
        # hand over: the old standby writes on from the same log, the old active follows
        await wait_until(lambda: active.ha.status()["election"]["ineligible"] == [],
                         what="the standby counted again at the acceptors")  # fmt: skip
        active.ha.demote({})
        await wait_until(lambda: actives(nodes) == [second], what="the hand-over")
        await standby.state.put("leases", "10.0.0.99", {"n": 99})
        await wait_until(lambda: active.state.position == standby.state.position,
                         what="the old active to follow")  # fmt: skip
        assert active.state.get("leases", "10.0.0.99") == {"n": 99}
        assert active.state.position.epoch > 1 and active.state.position.lsn == 21
        await trio.sleep(0)


async def test_a_standby_that_does_not_follow_is_ineligible_and_taken_only_by_force(
    tmp_path, monkeypatch
):
    """The active commits without a standby only once a majority of acceptors know it is
    ineligible; that standby then never takes the lease by itself, even with the active gone
    (it may lack what was committed without it); an operator's forced promote does."""
    from appliance.state import service as service_module

    async def never(self, peer, address):  # this standby's replication never connects
        await trio.sleep(3600)
        return False

    async with rack(tmp_path) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        first = actives(nodes)[0]
        second = "b" if first == "a" else "a"
        active, standby = nodes[first], nodes[second]
        laggard = standby.cluster.identity.node_id
        await wait_until(lambda: standby.replication.following.get("stage") == "stream",
                         what="the standby to follow")  # fmt: skip
        monkeypatch.setattr(service_module.Replication, "_follow", never)
        standby.replication.following = {}
        # cut the standby's link: the active sees it gone and declares it ineligible
        active.replication.disconnect(laggard)
        with trio.fail_after(2):  # ineligible in force within a renewal, then it commits
            await active.state.put("leases", "10.0.0.7", {"mac": "aa"})
        assert active.ha.status()["election"]["ineligible"] == [laggard]
        assert standby.state.get("leases", "10.0.0.7") is None
        active.request_stop("gone")  # the active goes away: the laggard must not take over
        await trio.sleep(3)
        assert standby.role is not Role.ACTIVE
        assert "ineligible" in standby.ha.status()["election"]["last_refusal"]
        standby.ha.promote({"force": True})
        await wait_until(lambda: standby.role is Role.ACTIVE, what="the forced promote")


async def test_prometheus_shows_the_log_and_each_followers_lag(tmp_path):
    from prometheus_client import generate_latest

    async with rack(tmp_path) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        active = nodes[actives(nodes)[0]]
        await wait_until(lambda: active.replication.followers, what="the standby to follow")
        await active.state.put("ns", "k", 1)
        text = generate_latest(active.metrics).decode()
        assert "rackboot_state_lsn 1.0" in text
        assert "rackboot_state_follower_lag{peer=" in text
        assert "rackboot_state_follower_counted{peer=" in text


async def test_a_standby_whose_clock_is_too_far_off_is_declared_ineligible(tmp_path):
    async with rack(tmp_path) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        active = nodes[actives(nodes)[0]]
        await wait_until(lambda: any(s.skew is not None
                                     for s in active.replication.followers.values()),
                         what="a clock probe")  # fmt: skip
        (peer, stream), = active.replication.followers.items()
        assert abs(stream.skew) < 0.1  # one machine, one clock
        assert active.replication.status()["followers"][peer]["clock_skew"] is not None
        stream.skew = active.replication.rule.max_clock_skew + 1.0  # as if its clock ran ahead
        active.replication.refresh_eligibility()
        assert peer in active.ha.election.proposer.wanted_ineligible
        await wait_until(lambda: active.ha.status()["election"]["ineligible"] == [peer],
                         what="the acceptors to know")  # fmt: skip


async def test_a_graceful_hand_over_waits_for_the_standby_and_keeps_every_record(tmp_path):
    """`rackboot ha handover` on the active: released only once the standby has every
    committed record (and refused for a target that is not an appliance of the rack)."""
    from appliance.control import ControlRequestError

    async with rack(tmp_path) as (nodes, _):
        active, standby = await filled(nodes, 30)
        second = next(name for name, node in nodes.items() if node is standby)
        with pytest.raises(ControlRequestError, match="not an appliance of this rack"):
            active.ha.handover({"to": "0123456789abcdef"})
        # the standby stops acknowledging (its link cut): the hand-over must wait for it
        peer = standby.cluster.identity.node_id
        active.replication.disconnect(peer)
        await wait_until(lambda: peer not in active.replication.caught_up(), what="the cut")
        status = active.ha.handover({"to": peer})
        assert status["election"]["handover"]["to"] == peer
        await wait_until(lambda: actives(nodes) == [second], timeout=10, what="the hand-over")
        assert standby.state.position == active.state.position  # it had everything
        assert active.ha.status()["last_change"].endswith("handover")
        assert standby.state.get("leases", "10.0.0.29") == {"n": 29}
