"""The node's clock is CLOCK_BOOTTIME, and the fence can be asked from a worker thread."""

from __future__ import annotations

import time

import trio

from appliance.clock import BoottimeClock, boottime
from appliance.node import Node
from tests.support.plugins import configured


def test_trio_runs_on_boottime():
    async def main():
        before = boottime()
        now = trio.current_time()
        await trio.sleep(0.01)
        later = trio.current_time()
        return before, now, later, boottime()

    before, now, later, after = trio.run(main, clock=BoottimeClock())
    assert before <= now <= later <= after
    assert later - now >= 0.01
    # CLOCK_BOOTTIME counts suspended time: never behind CLOCK_MONOTONIC
    assert boottime() >= time.monotonic() - 0.001


def test_the_fence_answers_from_a_worker_thread(tmp_path):
    """TFTP's pump asks the fence from its own thread, where trio.current_time() raises."""
    config, pm = configured(tmp_path, {"node": {"data_dir": str(tmp_path / "n")}})
    node = Node(config, pm)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: node.run(handle_signals=False,
                                                             task_status=task_status))
            assert await trio.to_thread.run_sync(node.fence.ok)  # standalone: endless
            node.fence.grant(trio.current_time() + 0.05, epoch=3)
            assert await trio.to_thread.run_sync(node.fence.ok)
            await trio.sleep(0.06)
            assert not await trio.to_thread.run_sync(node.fence.ok)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=BoottimeClock())
