"""The state log's own worker thread, and changefeeds woken by their namespace only."""

from __future__ import annotations

import math
import threading

import pytest
import trio
import trio.testing

from appliance.ha.fence import Fence
from appliance.state.log import Worker
from appliance.state.store import Change, Position, Reset, StateStore
from appliance.state.tables import Tables


async def test_calls_run_in_order_on_one_thread_and_bring_back_results_and_errors():
    worker = Worker()
    seen: list[tuple[int, str]] = []

    def call(n: int) -> int:
        seen.append((n, threading.current_thread().name))
        return n * 2

    def fail() -> None:
        raise OSError(28, "No space left on device")

    try:
        results = [await worker(call, n) for n in range(5)]
        assert results == [0, 2, 4, 6, 8]
        with pytest.raises(OSError, match="No space"):
            await worker(fail)
        async with trio.open_nursery() as nursery:  # concurrent callers: one at a time
            for n in range(5, 10):
                nursery.start_soon(worker, call, n)
        assert sorted(n for n, _ in seen) == list(range(10))
        assert {name for _, name in seen} == {"state-log"}
        assert threading.current_thread().name != "state-log"
    finally:
        worker.close()


async def test_a_closed_worker_starts_again_and_a_call_is_not_cancelled_midway():
    worker = Worker()
    await worker(lambda: None)
    first = worker._thread
    worker.close()
    assert await worker(lambda: 7) == 7 and worker._thread is not first
    release = threading.Event()
    threading.Timer(0.05, release.set).start()
    with trio.CancelScope() as scope:
        scope.cancel()  # handed over, the call is waited for (as trio.to_thread's is)
        assert await worker(lambda: release.wait(5)) is True
    worker.close()


def fence() -> Fence:
    f = Fence(lambda: 0.0)
    f.grant(math.inf, 1)
    return f


async def test_a_changefeed_sleeps_through_other_namespaces_and_keeps_its_place(tmp_path):
    store = StateStore(tmp_path, fence())
    await trio.to_thread.run_sync(store.load)
    got: list[Change | Reset] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)

        async def follow() -> None:
            async for change in store.subscribe("a"):
                got.append(change)

        nursery.start_soon(follow)
        for n in range(20):
            await store.put("b", f"k{n}", n)  # not "a": the feed is not woken
        assert set(store._changed) == {"a"} and not got
        await store.put("a", "x", 1)
        await store.put("b", "k", 0)
        await store.put("a", "y", 2)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [Change(Position(1, 21), "x", 1), Change(Position(1, 23), "y", 2)]
        # A snapshot from the leader replaces everything: every feed starts over.
        tables = Tables()
        tables.restore(*store.snapshot())
        tables.data["a"]["z"] = 3
        tables.lsn = 30
        await store.install(*tables.snapshot())
        await trio.testing.wait_all_tasks_blocked()
        assert got[-1] == Reset(Position(1, 30), {"x": 1, "y": 2, "z": 3})
        nursery.cancel_scope.cancel()
