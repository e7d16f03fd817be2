"""Replication between real nodes over loopback (TLS, signed frames): what the active
writes reaches the standby, which after a hand-over writes on from there; the old active
then follows it."""

from __future__ import annotations

import trio

from tests.trio.test_cluster import wait_until
from tests.trio.test_ha import actives, rack


async def test_the_standby_follows_the_active_and_takes_over_with_its_state(tmp_path):
    async with rack(tmp_path) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        first = actives(nodes)[0]
        second = "b" if first == "a" else "a"
        active, standby = nodes[first], nodes[second]
        for n in range(20):
            await active.state.put("leases", f"10.0.0.{n}", {"n": n})
        await wait_until(lambda: standby.state.position == active.state.position,
                         what="the standby to catch up")  # fmt: skip
        assert standby.state.tables.data == active.state.tables.data
        follower = active.replication.status()["followers"][standby.cluster.identity.node_id]
        assert follower["stage"] == "stream" and follower["lag"] == 0
        # hand over: the old standby writes on from the same log, the old active follows
        active.ha.demote({})
        await wait_until(lambda: actives(nodes) == [second], what="the hand-over")
        await standby.state.put("leases", "10.0.0.99", {"n": 99})
        await wait_until(lambda: active.state.position == standby.state.position,
                         what="the old active to follow")  # fmt: skip
        assert active.state.get("leases", "10.0.0.99") == {"n": 99}
        assert active.state.position.epoch > 1 and active.state.position.lsn == 21
        await trio.sleep(0)
