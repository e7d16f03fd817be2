"""The state store: commit on durability, the fence, restarts, compaction, the changefeed."""

from __future__ import annotations

import math
import os

import pytest
import trio

from appliance.ha.fence import Fence
from appliance.state import store as store_module
from appliance.state.store import Change, NotWriter, Position, Reset, StateStore


def fence(epoch: int = 1) -> Fence:
    f = Fence(lambda: 0.0)
    f.grant(math.inf, epoch)
    return f


async def started(path, f=None, **kw) -> StateStore:
    store = StateStore(path, f or fence(), **kw)
    await trio.to_thread.run_sync(store.load)
    return store


async def test_put_commits_when_durable_and_survives_a_restart(tmp_path):
    store = await started(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        first = await store.put("leases", "10.0.0.5", {"mac": "aa"})
        second = await store.put("leases", "10.0.0.6", {"mac": "bb"})
        await store.put("leases", "10.0.0.5", None)
        assert (first, second) == (Position(1, 1), Position(1, 2))
        assert store.get("leases", "10.0.0.6") == {"mac": "bb"}
        assert store.get("leases", "10.0.0.5") is None
        nursery.cancel_scope.cancel()
    again = await started(tmp_path)
    assert list(again.scan("leases")) == [("10.0.0.6", {"mac": "bb"})]
    assert again.position == Position(1, 3)


async def test_a_table_changes_only_once_its_record_is_durable(tmp_path):
    store = await started(tmp_path)
    store.append("ns", "k", 1)  # the writer is not running: nothing is durable yet
    assert store.get("ns", "k") is None and store.position.lsn == 0
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        while store.position.lsn < 1:
            await trio.sleep(0.001)
        assert store.get("ns", "k") == 1
        nursery.cancel_scope.cancel()


async def test_only_the_holder_writes_and_never_with_an_older_epoch(tmp_path):
    f = fence(epoch=5)
    store = await started(tmp_path, f)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await store.put("ns", "k", 1)
        f.revoke()
        with pytest.raises(NotWriter):
            store.append("ns", "k", 2)
        f.grant(math.inf, 4)  # a deposed holder's epoch
        with pytest.raises(NotWriter):
            store.append("ns", "k", 2)
        nursery.cancel_scope.cancel()
    assert store.get("ns", "k") == 1


async def test_a_failed_write_is_retried_and_nothing_after_it_overtakes_it(tmp_path, monkeypatch):
    store = await started(tmp_path)
    real, calls = store.log.journal.append, []

    def flaky(data, count):
        calls.append(count)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real(data, count)

    monkeypatch.setattr(store.log.journal, "append", flaky)
    monkeypatch.setattr(store_module, "RETRY_WRITE", 0.01)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await store.put("ns", "a", 1)
        await store.put("ns", "b", 2)
        nursery.cancel_scope.cancel()
    assert store.counters["write_failures"] == 1
    again = await started(tmp_path)
    assert dict(again.scan("ns")) == {"a": 1, "b": 2} and again.position.lsn == 2


async def test_compaction_keeps_the_state_and_the_positions(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "COMPACT_MIN_RECORDS", 50)
    store = await started(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for n in range(400):
            await store.put("ns", f"k{n % 10}", n)
        nursery.cancel_scope.cancel()
    assert store.counters["compactions"] >= 5
    assert os.path.getsize(tmp_path / "log") < 4000
    again = await started(tmp_path)
    assert dict(again.scan("ns")) == {f"k{n}": 390 + n for n in range(10)}
    assert again.position == Position(1, 400) and again.base > 0


async def test_the_changefeed_gives_every_change_in_order_then_waits(tmp_path):
    store = await started(tmp_path)
    seen: list = []

    async def reader(after):
        async for item in store.subscribe("leases", after):
            seen.append(item)

    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await store.put("leases", "a", 1)
        await store.put("events", "x", 1)  # another namespace: not this reader's
        nursery.start_soon(reader, Position(1, 1))
        await store.put("leases", "b", 2)
        await store.put("leases", "a", None)
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert seen == [Change(Position(1, 3), "b", 2), Change(Position(1, 4), "a", None)]


async def test_a_reader_behind_a_compaction_or_off_the_history_starts_from_a_reset(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(store_module, "COMPACT_MIN_RECORDS", 20)
    store = await started(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for n in range(100):
            await store.put("ns", f"k{n % 4}", n)
        await trio.sleep(0.01)
        assert 1 < store.base < 99
        feeds = []
        # compacted away; this LSN under an epoch this log never wrote; beyond its end
        for after in (Position(1, 1), Position(7, 99), Position(1, 1000)):
            feed = store.subscribe("ns", after)
            feeds.append(await feed.__anext__())
        nursery.cancel_scope.cancel()
    for first in feeds:
        assert isinstance(first, Reset)
        assert first.position == Position(1, 100)
        assert first.items == {f"k{n}": 96 + n for n in range(4)}


async def test_a_record_a_reader_would_refuse_is_refused_when_appended(tmp_path):
    """A 600-character key used to commit, and the next start found the log damaged
    (0 keys); a standby refused the frame on every redial."""
    store = await started(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for ns, key, value in [("ns", "k" * 600, 1), ("n" * 65, "k", 1), ("ns", "k", {1: "x"})]:
            with pytest.raises(ValueError):
                store.append(ns, key, value)
        await store.put("ns", "k", {"ok": 1})
        nursery.cancel_scope.cancel()
    store.log.close()
    again = await started(tmp_path)
    assert again.get("ns", "k") == {"ok": 1} and not again.status()["problem"]


async def test_a_commit_callback_that_raises_is_counted_and_the_store_goes_on(tmp_path):
    store = await started(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)

        def broken(position):
            raise RuntimeError("a plugin's bug")

        store.append("ns", "a", 1, broken)
        await store.put("ns", "b", 2)
        assert store.status()["callback_failures"] == 1 and store.get("ns", "a") == 1
        nursery.cancel_scope.cancel()
