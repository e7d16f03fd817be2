"""The assembly plan and the completion bitmap (plugins/images/plan.py), no I/O."""

from __future__ import annotations

import hashlib

from plugins.images.manifest import Params, Table
from plugins.images.plan import Bitmap, Run, make_plan

PARAMS = Params(1024, 4096, 16384)


def ids(*names: str) -> tuple[bytes, ...]:
    return tuple(hashlib.sha256(n.encode()).digest() for n in names)


def test_chunks_are_done_zero_local_or_fetched_in_runs():
    table = Table(PARAMS, ids("a", "b", "z", "c", "d", "e", "f"), (4000,) * 7)
    held = {ids("c")[0]: "seed-c"}
    done = Bitmap(7)
    done.set(0)
    plan = make_plan(table, held.get, lambda chunk, size: chunk == ids("z")[0], done,
                     run_bytes=8000)  # fmt: skip
    assert plan.done == 1 and plan.zero == [2] and plan.local == [(3, "seed-c")]
    # b alone (between done a and zero z); d e f split at 8,000 bytes a run
    assert plan.runs == [Run(1, 2, 4000, 4000), Run(4, 6, 16000, 8000), Run(6, 7, 24000, 4000)]
    assert plan.fetch_bytes == 16000


def test_the_bitmap_round_trips_and_ignores_a_wrong_length():
    bitmap = Bitmap(10)
    for i in (0, 3, 9):
        bitmap.set(i)
    again = Bitmap(10, bitmap.encode())
    assert [i for i in range(10) if again[i]] == [0, 3, 9] and again.ones() == 3
    assert Bitmap(10, b"\xff").ones() == 0  # not this table's bitmap: start over
    assert not again.all()


def test_the_follower_syncs_what_boot_profiles_load_first():
    from plugins.images.follow import Follower

    class Store:
        images = {"old": {"1": object()}}

    follower = Follower(None, Store(), None, [], None, in_use=frozenset({"kernel"}))
    follower.committed = dict.fromkeys(["aaa@1", "aaa@2", "kernel@3", "kernel@2", "old@1"], b"")
    follower.current = {"aaa": "2", "kernel": "3"}
    assert follower.missing() == ["kernel@3", "aaa@2", "aaa@1", "kernel@2"]
