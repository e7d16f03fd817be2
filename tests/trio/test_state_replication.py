"""Two stores joined by the replication stream in memory: the follower ends with the
leader's log, whatever it started with (nothing, a divergent tail, a log behind the
leader's snapshot), and acknowledges only what is on its disk."""

from __future__ import annotations

import math

import trio

from appliance.ha.fence import Fence
from appliance.state import store as store_module
from appliance.state.replication import Append, FollowerStream, Install, LeaderStream, Truncate
from appliance.state.store import StateStore


def fence(epoch: int) -> Fence:
    f = Fence(lambda: 0.0)
    f.grant(math.inf, epoch)
    return f


async def store_at(path, epoch=1) -> StateStore:
    store = StateStore(path, fence(epoch))
    await trio.to_thread.run_sync(store.load)
    return store


async def replicate(leader: StateStore, follower: StateStore, epoch: int) -> LeaderStream:
    """One hand-shake and stream until the follower acknowledged everything."""
    await follower.prepare_to_follow()  # as the shell does before its hello
    stream = LeaderStream(leader, epoch)
    end = follower.tables.history
    last = follower.position
    side = FollowerStream((last.epoch, last.lsn), end, known_epoch=0)
    actions, _ = side.receive(stream.receive(side.hello()))
    for action in actions:
        assert isinstance(action, Truncate)
        await follower.cut_after(action.lsn)
    stream.receive(side.resume(follower.position.epoch, follower.position.lsn))
    while True:
        message = stream.next_message()
        if message is None:
            if stream.acked >= leader.last():
                return stream
            await trio.sleep(0.001)
            continue
        actions, _ = side.receive(message)
        for action in actions:
            if isinstance(action, Install):
                await follower.install(action.head, action.entries)
                stream.receive(side.durable(action.head.lsn))  # counted once installed
            elif isinstance(action, Append):
                acked = trio.Event()
                follower.append_replicated(action.records, lambda lsn, done=acked: done.set())
                await acked.wait()
                stream.receive(side.durable(action.records[-1].lsn))


async def test_a_follower_gets_the_leaders_state_and_keeps_it(tmp_path):
    leader, follower = await store_at(tmp_path / "a"), await store_at(tmp_path / "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(leader.run)
        await nursery.start(follower.run)
        for n in range(300):
            await leader.put("leases", f"10.0.0.{n % 50}", {"n": n})
        await replicate(leader, follower, 1)
        assert follower.tables.data == leader.tables.data
        assert follower.position == leader.position
        nursery.cancel_scope.cancel()
    again = await store_at(tmp_path / "b")
    assert again.tables.data == leader.tables.data


async def test_a_deposed_leaders_divergent_tail_is_cut_when_it_follows(tmp_path):
    a, b = await store_at(tmp_path / "a"), await store_at(tmp_path / "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        for n in range(10):
            await a.put("ns", f"k{n}", n)
        await replicate(a, b, 1)
        # a writes on, but nobody receives it: then b takes over with epoch 2
        for n in range(3):
            await a.put("ns", "lost", n)
        b.fence.grant(math.inf, 2)
        for n in range(5):
            await b.put("ns", f"new{n}", n)
        a.fence.revoke()  # deposed
        a.advance()
        await replicate(b, a, 2)
        assert a.get("ns", "lost") is None
        assert a.tables.data == b.tables.data and a.position == b.position
        nursery.cancel_scope.cancel()


async def test_a_follower_behind_the_leaders_snapshot_installs_it(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "COMPACT_MIN_RECORDS", 30)
    leader, follower = await store_at(tmp_path / "a"), await store_at(tmp_path / "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(leader.run)
        await nursery.start(follower.run)
        for n in range(5):
            await leader.put("ns", f"k{n}", n)
        await replicate(leader, follower, 1)
        for n in range(200):
            await leader.put("ns", f"k{n % 7}", n)
        await trio.sleep(0.01)
        assert leader.base > follower.position.lsn
        await replicate(leader, follower, 1)
        assert follower.tables.data == leader.tables.data
        nursery.cancel_scope.cancel()


async def test_a_follower_whose_log_is_damaged_in_the_middle_gets_it_again_whole(tmp_path):
    """A hole in the middle of a standby's log (a bad sector): applied around, the keys
    written only in the hole would stay missing there for ever; as a follower it drops
    the log and the leader sends everything again."""
    leader, follower = await store_at(tmp_path / "a"), await store_at(tmp_path / "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(leader.run)
        await nursery.start(follower.run)
        for n in range(60):
            await leader.put("ns", f"k{n}", n)  # each key written once: a hole loses some
        await replicate(leader, follower, 1)
        nursery.cancel_scope.cancel()
    path = follower.log.path
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    damaged = await store_at(tmp_path / "b")
    assert damaged.status()["problem"] and damaged.resync_needed
    assert damaged.tables.data != leader.tables.data  # records in the hole are missing
    await trio.to_thread.run_sync(damaged.log.close)
    restarted = await store_at(tmp_path / "b")  # before any leader: the need is kept
    assert restarted.resync_needed
    await trio.to_thread.run_sync(restarted.log.close)
    damaged = await store_at(tmp_path / "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(leader.run)
        await nursery.start(damaged.run)
        await replicate(leader, damaged, 1)
        assert damaged.tables.data == leader.tables.data
        assert damaged.position == leader.position and not damaged.resync_needed
        nursery.cancel_scope.cancel()
    again = await store_at(tmp_path / "b")  # the damaged copy is kept for the operator
    assert again.tables.data == leader.tables.data and not again.resync_needed

