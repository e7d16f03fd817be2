"""Group commit: appends made while a write is in flight share the next write.

The journal's :class:`GroupCommitter` first, then the same promises where DHCP's leases
live now, the state log's writer (appliance/state/store.py) under the lease store: the
ACKs decided while a write is in flight share the next write and fsync, none is called
back before its record is on disk, and a failed write is retried before anything later."""

from __future__ import annotations

import math
import os
import stat
import threading

import trio

from appliance.ha.fence import Fence
from appliance.journal import GroupCommitter, JournalFile
from appliance.state import store as state_store
from appliance.state.store import StateStore
from plugins.dhcp.leases import Lease, LeaseState, LeaseView
from plugins.dhcp.store import LeaseStore
from tests.support.logs import captured_logs

NOW = 1_000_000.0


class GatedJournal(JournalFile):
    """A journal whose appends wait for the test to open a gate (a slow disk)."""

    def __init__(self, path):
        super().__init__(path)
        self.gate = threading.Event()
        self.calls: list[int] = []
        self.fail_next = False

    def append(self, frames: bytes, count: int) -> None:
        self.calls.append(count)
        assert self.gate.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise OSError(28, "No space left on device")
        super().append(frames, count)


async def test_appends_during_a_write_share_the_next_one(tmp_path, autojump_clock):
    journal = GatedJournal(tmp_path / "j")
    journal.open()
    committer = GroupCommitter(journal)
    durable: list[int] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(committer.run)
            committer.submit(b"0", lambda: durable.append(0))
            while not journal.calls:  # until the first write is in flight (virtual time)
                await trio.sleep(0.001)
            for i in range(1, 50):
                committer.submit(b"%d" % i, lambda i=i: durable.append(i))
            assert durable == []  # nothing is claimed before it is on disk
            journal.gate.set()
            while len(durable) < 50:
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    assert journal.calls == [1, 49]
    assert durable == list(range(50))
    journal.close()
    assert JournalFile(tmp_path / "j").open() == [b"%d" % i for i in range(50)]


async def test_a_failed_write_acknowledges_nothing_and_later_writes_work(tmp_path, autojump_clock):
    journal = GatedJournal(tmp_path / "j")
    journal.open()
    journal.gate.set()
    journal.fail_next = True
    committer = GroupCommitter(journal)
    durable: list[bytes] = []
    committer.submit(b"lost", lambda: durable.append(b"lost"))
    await committer.flush()
    assert durable == [] and committer.failures == 1 and committer.pending == 0
    committer.submit(b"kept", lambda: durable.append(b"kept"))
    await committer.flush()
    assert durable == [b"kept"]
    journal.close()
    assert JournalFile(tmp_path / "j").open() == [b"kept"]


async def test_rewrite_compacts_to_the_snapshot_and_keeps_later_records(tmp_path, autojump_clock):
    journal = JournalFile(tmp_path / "j")
    journal.open()
    committer = GroupCommitter(journal)
    state = {"a": b"a1"}
    for payload in (b"a0", b"b0", b"a1"):
        committer.submit(payload)
    await committer.flush()
    assert journal.records == 3
    committer.request_rewrite(lambda: sorted(state.values()))
    committer.submit(b"c0")  # pending while the rewrite runs: appended after it
    await committer.flush()
    journal.close()
    assert (committer.rewrites, committer.batches) == (1, 2)
    reopened = JournalFile(tmp_path / "j")
    assert reopened.open() == [b"a1", b"c0"]
    assert not (tmp_path / "j.compact").exists()


async def test_a_rename_not_made_durable_is_reported_so_and_acknowledges_nothing(
    tmp_path, monkeypatch
):
    journal = JournalFile(tmp_path / "j")
    journal.open()
    committer = GroupCommitter(journal)
    for payload in (b"a0", b"b0", b"a1"):
        committer.submit(payload)
    await committer.flush()
    real_fsync, durable = os.fsync, []

    def directory_fsync_fails(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    with captured_logs() as lines:
        with monkeypatch.context() as patch:
            patch.setattr(os, "fsync", directory_fsync_fails)
            committer.request_rewrite(lambda: [b"a1", b"b0"])
            committer.submit(b"c0", lambda: durable.append(b"c0"))
            await committer.flush()
            # Appended to the renamed file, whose name may not survive a crash: not durable.
            assert durable == [] and (committer.compaction_failures, committer.failures) == (1, 1)
        committer.submit(b"c1", lambda: durable.append(b"c1"))
        await committer.flush()
    assert durable == [b"c1"] and committer.status()["rewrites"] == 1
    errors = [line["msg"] for line in lines() if line["level"] == "error"]
    assert "may not survive a crash" in errors[0] and not any("intact" in m for m in errors)
    journal.close()
    assert JournalFile(tmp_path / "j").open() == [b"a1", b"b0", b"c1"]


async def test_a_compaction_failed_before_the_rename_says_the_old_file_is_intact(
    tmp_path, monkeypatch
):
    journal = JournalFile(tmp_path / "j")
    journal.open()
    committer = GroupCommitter(journal)
    committer.submit(b"a0")
    await committer.flush()

    def rename_fails(*args):
        raise OSError(28, "No space left on device")

    durable = []
    with captured_logs() as lines, monkeypatch.context() as patch:
        patch.setattr(os, "replace", rename_fails)
        committer.request_rewrite(lambda: [b"a0"])
        committer.submit(b"a1", lambda: durable.append(b"a1"))
        await committer.flush()
    assert durable == [b"a1"] and committer.status()["compaction_failures"] == 1
    (error,) = [line for line in lines() if line["level"] == "error"]
    assert "old file is intact" in error["msg"] and error["step"] == "rename j.compact over j"
    journal.close()
    assert JournalFile(tmp_path / "j").open() == [b"a0", b"a1"]


# -- DHCP's leases on the state log ------------------------------------------------------


def gated_lease_store(tmp_path):
    """A lease store on a state log whose disk is :class:`GatedJournal` (the writer not
    started)."""
    fence = Fence(trio.current_time)
    fence.grant(math.inf, epoch=1)
    state = StateStore(tmp_path, fence)
    state.log.journal = GatedJournal(tmp_path / "log")
    state.load()
    view = LeaseView()
    return state, view, LeaseStore(state, view)


def ack(view, store, n: int, durable: list[int]) -> None:
    """What the server and its shell do for one ACK: the lease pending, then committed."""
    lease = Lease(0xC0000264 + n, b"\x01" + bytes(6), bytes(6), "192.0.2.0/24",
                  LeaseState.BOUND, NOW, NOW + 600)  # fmt: skip
    view.add(lease)
    store.commit([lease], lambda: durable.append(n))


async def test_dhcp_acks_decided_during_a_state_write_share_the_next_one(tmp_path):
    state, view, store = gated_lease_store(tmp_path)
    durable: list[int] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(state.run)
            ack(view, store, 0, durable)
            while not state.log.journal.calls:  # the first write is in flight
                await trio.sleep(0.001)
            for n in range(1, 50):
                ack(view, store, n, durable)
            assert durable == []  # nothing is acknowledged before it is on disk
            state.log.journal.gate.set()
            while len(durable) < 50:
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    assert state.log.journal.calls == [1, 49] and state.counters["writes"] == 2
    assert durable == list(range(50)) and view.pending() == 50  # no feed ran: still pending


async def test_a_failed_state_write_acknowledges_nothing_until_it_is_retried(tmp_path, monkeypatch):
    monkeypatch.setattr(state_store, "RETRY_WRITE", 0.05)
    state, view, store = gated_lease_store(tmp_path)
    journal = state.log.journal
    journal.gate.set()
    journal.fail_next = True
    durable: list[int] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(state.run)
            ack(view, store, 0, durable)
            while not state.counters["write_failures"]:
                await trio.sleep(0.001)
            ack(view, store, 1, durable)  # after the failure: written only after the retry
            assert durable == []
            while len(durable) < 2:
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    assert durable == [0, 1] and state.counters["write_failures"] == 1
    assert journal.calls == [1, 2]  # the failed write again, with what came meanwhile
    state.log.close()
    reopened = StateStore(tmp_path, Fence(lambda: 0.0))
    assert reopened.load().tables.lsn == 2  # both on disk, once each, in order
