"""Failover cases of the replicated state log between two real appliances and a witness in
one process over loopback (the election over UDP, replication over TLS; real clock, as
tests/trio/test_ha.py: real sockets do not mix with the autojump clock, so every wait is
bounded instead):

* the standby crashes while catching up on a backlog of records, or on a snapshot, and
  restarts from the same data directory: it ends with exactly the active's tables and
  position, while the active kept committing without it (declared ineligible), and it
  counts again once it caught up; a current standby whose disk hangs holds one commit up
  for the acknowledgement timeout, is declared, and after a restart counts again;
* the active crashes while the standby is still catching up: the lagging standby is not
  elected by itself, however long it waits; the old active, restarted, is active again
  with every record it committed. (An operator's way out, ``promote --force`` on the
  laggard, is tests/trio/test_state_ha.py's
  ``test_a_standby_that_does_not_follow_is_ineligible_and_taken_only_by_force``.)
* fail-back: A commits, A crashes with records its standby never acknowledged, B takes
  over and commits more, A restarts, follows B (its uncommitted tail is cut), catches up,
  and a promote of A hands the lease back: nothing acknowledged is lost either way.

A *crash* is the node's cancel scope cancelled with its election datagrams dropped first:
no release leaves, so the acceptors hold its grant to the end (kill -9; the real-network
version is tests/real/test_dhcp_failback.py). A *stalled disk* holds the state store's
blocking calls of one node's life (its writes, or the rewrite a snapshot install does)
until released or the node dies.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from appliance.api import Role
from appliance.ha.witness import Witness, load_identity
from appliance.node import Node
from appliance.state import plugin as state_plugin
from appliance.state import store as store_module
from appliance.state.store import StateStore
from tests.support.ha import enrol_members, free_udp_ports, node_id
from tests.support.plugins import configured
from tests.trio.test_cluster import wait_until
from tests.trio.test_ha import CLUSTER

LEASE = 1.0  # s, the [ha] default the rack runs with
# Backlogs (records, keys): below COMPACT_MIN_RECORDS (4,096) for a catch-up by records;
# for one by snapshot, COMPACT_MIN_RECORDS is lowered to 300 and 40 keys take 2,000 records.
SIZES = {"records": (3000, 1500), "snapshot": (2000, 40)}


class Disk:
    """One life's stalled disk: the store's blocking calls named ``call`` are held (as a
    hung disk) once ``when(store)`` says so, until :meth:`heal` or the node dies."""

    def __init__(self, call: str, when: Callable[[StateStore], bool]) -> None:
        self.call, self.when = call, when
        self.stalled = trio.Event()
        self.healed = trio.Event()
        self.store: StateStore | None = None

    def wrap(self, store: StateStore) -> None:
        self.store = store
        real = store._blocking  # the store's own way (its worker thread)

        async def blocking(fn: Callable[..., Any], *args: Any) -> Any:
            if getattr(fn, "__name__", "") == self.call and self.when(store):
                self.stalled.set()
                await self.healed.wait()
            return await real(fn, *args)

        store._blocking = blocking

    def heal(self) -> None:
        self.healed.set()


class Rack:
    """Appliances ``a`` and ``b`` and witness ``w``; each appliance in a cancel scope of
    its own, so that it can crash and start again from the same data directory."""

    def __init__(self, tmp_path: Path, nursery: trio.Nursery, monkeypatch) -> None:
        names = ["a", "b", "w"]
        self.dirs = enrol_members(tmp_path, names)
        self.ports = dict(zip(names, free_udp_ports(3), strict=True))
        self.ids = {n: node_id(self.dirs[n]) for n in names}
        self.nursery = nursery
        self.nodes: dict[str, Node] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.gone: dict[str, trio.Event] = {}
        self.disks: dict[str, Disk] = {}  # the next life's stalled disk, by node
        real = state_plugin.StateStore

        def make_store(directory: Path, fence: Any) -> StateStore:
            store = real(directory, fence)
            for name, disk in list(self.disks.items()):
                if Path(directory).parent == self.dirs[name]:
                    disk.wrap(store)
                    del self.disks[name]
            return store

        monkeypatch.setattr(state_plugin, "StateStore", make_store)

    def member(self, name: str) -> str:
        return f"{self.ids[name]}@127.0.0.1:{self.ports[name]}"

    async def start_witness(self) -> None:
        witness = Witness(load_identity(str(self.dirs["w"])), "127.0.0.1", self.ports["w"], LEASE)
        await self.nursery.start(
            lambda task_status: witness.run(handle_signals=False, task_status=task_status)
        )

    async def start(self, name: str, disk: Disk | None = None) -> Node:
        other = "b" if name == "a" else "a"
        ha = {"port": self.ports[name], "peers": [self.member(other)],
              "witnesses": [self.member("w")]}  # fmt: skip
        config, pm = configured(
            self.dirs[name],
            {"node": {"name": name, "data_dir": str(self.dirs[name])}, "cluster": CLUSTER,
             "ha": ha},
        )  # fmt: skip
        node = Node(config, pm)
        scope, gone = trio.CancelScope(), trio.Event()
        if disk is not None:
            self.disks[name] = disk

        async def life(task_status=trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await node.run(handle_signals=False, task_status=task_status)
            finally:
                gone.set()

        self.scopes[name], self.gone[name] = scope, gone
        await self.nursery.start(life)
        self.nodes[name] = node
        return node

    async def crash(self, name: str) -> None:
        """As kill -9: nothing more leaves, no release; what was not on disk is lost."""
        node = self.nodes[name]
        node.ha.transport.send = lambda address, message: None  # the release among them
        self.scopes[name].cancel()
        with trio.fail_after(10):
            await self.gone[name].wait()

    def actives(self) -> list[str]:
        return [n for n, node in self.nodes.items()
                if not self.gone[n].is_set() and node.role is Role.ACTIVE]  # fmt: skip

    def ineligible(self, name: str) -> list[str]:
        """Whom ``name``'s last granted proposal declared ineligible (what the acceptors
        know)."""
        return self.nodes[name].ha.status()["election"]["ineligible"]

    def counted(self, leader: str, follower: str) -> bool:
        """``follower`` follows ``leader`` with everything it appended, and the acceptors
        know it counts again."""
        status = self.nodes[leader].replication.status()
        row = status["followers"].get(self.ids[follower])
        return bool(
            row
            and row["counted"]
            and row["lag"] == 0
            and self.ineligible(leader) == []
            and self.nodes[follower].state.position == self.nodes[leader].state.position
        )


async def up(tmp_path: Path, nursery: trio.Nursery, monkeypatch) -> tuple[Rack, str, str]:
    """A started rack with its active and its standby, which counts."""
    rack = Rack(tmp_path, nursery, monkeypatch)
    await rack.start_witness()
    await rack.start("a")
    await rack.start("b")
    await wait_until(lambda: len(rack.actives()) == 1, what="one active")
    first = rack.actives()[0]
    second = "b" if first == "a" else "a"
    await wait_until(lambda: rack.counted(first, second), what="the standby counted")
    return rack, first, second


async def backlog(store: StateStore, count: int, keys: int, tag: str) -> dict[str, int]:
    """``count`` records over ``keys`` keys of namespace ``bulk``, appended without waiting
    (group commit), returned once the last committed: what was acknowledged."""
    done = trio.Event()
    acked: dict[str, int] = {}
    failed: list[int] = []

    def committed(n: int, key: str) -> Callable[[Any], None]:
        def callback(position: Any) -> None:
            if position is None:
                failed.append(n)
            else:
                acked[key] = n
            if n == count - 1:
                done.set()

        return callback

    for n in range(count):
        key = f"{tag}{n % keys}"
        store.append("bulk", key, {"n": n, "tag": tag}, committed(n, key))
        if n % 256 == 255:
            await trio.sleep(0)  # let the writer take a batch
    with trio.fail_after(30):
        await done.wait()
    assert not failed, f"records not committed: {failed[:5]}"
    return acked


class Writer:
    """Puts on the active, one after another, for as long as it runs: every put that
    returned is an acknowledged record."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.acked: dict[str, int] = {}
        self.longest = 0.0  # s, the longest a put waited for its commit
        self.scope = trio.CancelScope()

    async def run(self) -> None:
        with self.scope:
            n = 0
            while True:
                started = trio.current_time()
                await self.store.put("live", f"k{n % 97}", n)
                self.longest = max(self.longest, trio.current_time() - started)
                self.acked[f"k{n % 97}"] = n
                n += 1
                await trio.sleep(0.005)

    async def committed_more(self, than: int) -> None:
        await wait_until(lambda: len(self.acked) and max(self.acked.values()) > than,
                         what="the active to commit more")  # fmt: skip

    def last(self) -> int:
        return max(self.acked.values(), default=-1)


def holds(store: StateStore, ns: str, acked: dict[str, Any], value=lambda v: v) -> None:
    for key, v in acked.items():
        got = store.get(ns, key)
        assert got == value(v), f"{ns}/{key}: acknowledged {value(v)}, the table says {got}"


# -- the standby crashes while catching up ------------------------------------------------


@pytest.mark.parametrize("behind", ["records", "snapshot"])
async def test_a_standby_that_crashes_while_catching_up_restarts_and_ends_as_the_active(
    tmp_path, monkeypatch, behind
):
    """``records``: the standby's disk stalls after its first write of a backlog of 3,000
    records; ``snapshot``: the active compacted past the standby's log, and the standby's
    disk stalls as it installs the snapshot. Either way it crashes there, restarts from the
    same data directory, and ends with exactly the active's tables and position; the
    active committed throughout, without it, and counts it again once it caught up."""
    if behind == "snapshot":
        monkeypatch.setattr(store_module, "COMPACT_MIN_RECORDS", 300)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            rack, first, second = await up(tmp_path, nursery, monkeypatch)
            active = rack.nodes[first]
            await active.state.put("bulk", "before", 1)
            await wait_until(lambda: rack.counted(first, second), what="the standby has it")
            start = rack.nodes[second].state.position.lsn

            await rack.crash(second)
            acked = await backlog(active.state, *SIZES[behind], "x")
            # committed without the standby only once the acceptors knew it ineligible
            assert rack.ineligible(first) == [rack.ids[second]]
            if behind == "snapshot":
                await active.state.put("bulk", "compact", 1)  # compacts what committed
                assert active.state.base > start  # the standby's records are gone: a snapshot
            target = active.state.last()

            if behind == "records":
                # the first write goes through (a batch or a few), the next one hangs
                disk = Disk("append", lambda store: store.durable > start)
            else:
                disk = Disk("rewrite", lambda store: True)
            standby = await rack.start(second, disk)
            writer = Writer(active.state)
            nursery.start_soon(writer.run)
            with trio.fail_after(20):
                await disk.stalled.wait()
            # caught in the middle: part of the backlog (or nothing of the snapshot) is on disk
            assert start <= standby.state.durable < target
            if behind == "records":  # by records: the active kept every one after its log
                assert standby.state.durable > start and active.state.base <= start
            assert standby.replication.following.get("leader") == rack.ids[first]
            committed = writer.last()
            await writer.committed_more(committed + 5)  # the active does not wait for it
            assert rack.ineligible(first) == [rack.ids[second]]

            await rack.crash(second)
            assert rack.ineligible(first) == [rack.ids[second]]
            await writer.committed_more(writer.last() + 5)
            standby = await rack.start(second)
            await wait_until(lambda: rack.counted(first, second), timeout=30,
                             what="the restarted standby to catch up and count again")  # fmt: skip
            writer.scope.cancel()
            await wait_until(lambda: rack.counted(first, second), what="the last records")
            assert standby.state.position == active.state.position
            assert standby.state.tables.data == active.state.tables.data
            holds(standby.state, "bulk", acked, lambda n: {"n": n, "tag": "x"})
            holds(standby.state, "live", writer.acked)
            assert standby.replication.refused == {}
            # it counts: the next record waits for its acknowledgement (it is on its disk)
            await active.state.put("bulk", "after", 2)
            assert standby.state.durable >= active.state.position.lsn
            nursery.cancel_scope.cancel()


async def test_a_current_standby_whose_disk_hangs_is_declared_then_restarts_and_counts_again(
    tmp_path, monkeypatch
):
    """The standby counts and acknowledges every record; its disk hangs. The active's
    commits wait for it (at least the 0.5 s acknowledgement timeout) until a majority of
    acceptors know it ineligible, then go on without it. The standby crashes with records
    it received but never wrote, restarts, catches up and counts again, with every record
    the active acknowledged meanwhile."""
    from appliance.state.service import ACK_TIMEOUT

    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            rack, first, second = await up(tmp_path, nursery, monkeypatch)
            active, standby = rack.nodes[first], rack.nodes[second]
            writer = Writer(active.state)
            nursery.start_soon(writer.run)
            await writer.committed_more(20)
            assert rack.ineligible(first) == []
            assert writer.longest < ACK_TIMEOUT  # each commit had its acknowledgement

            disk = Disk("append", lambda store: True)
            disk.wrap(standby.state)  # from its next write on, nothing reaches its disk
            with trio.fail_after(10):
                await disk.stalled.wait()
            await wait_until(lambda: rack.ineligible(first) == [rack.ids[second]],
                             what="the standby declared ineligible")  # fmt: skip
            await writer.committed_more(writer.last() + 20)
            assert writer.longest >= ACK_TIMEOUT  # one commit waited for it, then none
            held = standby.state.durable
            assert held < active.state.position.lsn
            assert standby.state.last() > held  # received, acknowledged nothing of it

            await rack.crash(second)
            standby = await rack.start(second)
            await wait_until(lambda: rack.counted(first, second), timeout=30,
                             what="the restarted standby to catch up and count again")  # fmt: skip
            writer.scope.cancel()
            await wait_until(lambda: rack.counted(first, second), what="the last records")
            assert standby.state.position == active.state.position
            assert standby.state.tables.data == active.state.tables.data
            holds(standby.state, "live", writer.acked)
            nursery.cancel_scope.cancel()


# -- the active crashes while the standby is still catching up ----------------------------


@pytest.mark.parametrize(
    "behind",
    # snapshot: the leader counted the standby once the snapshot frames were sent, before
    # it installed them, and it was elected with an empty log (2,001 records lost; 5ee8bbd)
    ["records", "snapshot"],
)
async def test_the_active_crashing_while_its_standby_catches_up_leaves_nobody_until_it_returns(
    tmp_path, monkeypatch, behind
):
    """The active committed a backlog without its standby (declared ineligible) and dies
    while the standby is still catching up (its disk stalled in the middle of the records,
    or as it installs the snapshot). The standby must not take the lease by itself: it
    lacks committed records. Four leases later it still has not; the old active, restarted,
    takes the lease back with every record it committed, and the standby then catches up."""
    if behind == "snapshot":
        monkeypatch.setattr(store_module, "COMPACT_MIN_RECORDS", 300)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            rack, first, second = await up(tmp_path, nursery, monkeypatch)
            active = rack.nodes[first]
            start = rack.nodes[second].state.position.lsn
            await rack.crash(second)
            acked = await backlog(active.state, *SIZES[behind], "y")
            assert rack.ineligible(first) == [rack.ids[second]]
            if behind == "snapshot":
                await active.state.put("bulk", "compact", 1)  # compacts what committed
                assert active.state.base > start
            committed = copy.deepcopy(active.state.tables.data)
            position = active.state.position

            if behind == "records":
                disk = Disk("append", lambda store: store.durable > start)
            else:
                disk = Disk("rewrite", lambda store: True)
            standby = await rack.start(second, disk)
            with trio.fail_after(20):
                await disk.stalled.wait()
            assert standby.state.position.lsn < position.lsn
            # what the acceptors were last told while the active was alive: it still lags
            renewals = active.ha.status()["renewals"]
            await wait_until(lambda: active.ha.status()["renewals"] >= renewals + 6,
                             what="six more renewals of the idle active")  # fmt: skip
            assert rack.ineligible(first) == [rack.ids[second]], (
                "the active counted a standby that has not got its records: "
                f"{active.replication.status()}"
            )

            await rack.crash(first)
            elected: list[float] = []

            async def watch() -> None:
                while True:
                    if standby.role is Role.ACTIVE:
                        elected.append(trio.current_time())
                    await trio.sleep(0.01)

            nursery.start_soon(watch)
            await trio.sleep(4 * LEASE)  # several leases: the dead active's grant ran out long ago
            assert not elected, "the lagging standby was elected by itself"
            assert standby.state.position.lsn < position.lsn
            assert "ineligible" in standby.ha.status()["election"]["last_refusal"]

            back = await rack.start(first)  # the old active comes back
            await wait_until(lambda: rack.actives() == [first], timeout=10,
                             what="the old active to take the lease back")  # fmt: skip
            assert not elected
            assert back.ha.status()["epoch"] > position.epoch
            assert back.state.position == position  # its log, every record it committed
            assert back.state.tables.data == committed
            holds(back.state, "bulk", acked, lambda n: {"n": n, "tag": "y"})
            await back.state.put("bulk", "after", 1)  # and it writes on

            disk.heal()  # the standby's disk recovers: it catches up and counts again
            await wait_until(lambda: rack.counted(first, second), timeout=30,
                             what="the standby to catch up")  # fmt: skip
            assert standby.state.tables.data == back.state.tables.data
            assert not elected
            nursery.cancel_scope.cancel()


# -- fail-back ----------------------------------------------------------------------------


async def test_fail_back_the_old_active_cuts_its_tail_follows_and_takes_the_lease_back(
    tmp_path, monkeypatch
):
    """A commits; A appends three records its standby B never receives and crashes before
    they commit (its uncommitted, divergent tail). B takes over with everything A
    committed and commits more; A restarts, follows B, cuts the tail, catches up; a
    promote of A hands the lease back, A commits more, B follows. Every acknowledged record
    of each holder is on both; the tail is on neither."""
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            rack, a, b = await up(tmp_path, nursery, monkeypatch)
            first, second = rack.nodes[a], rack.nodes[b]
            acked: dict[str, Any] = {}
            for n in range(50):
                await first.state.put("ns", f"a{n}", n)
                acked[f"a{n}"] = n
            await wait_until(lambda: rack.counted(a, b), what="the standby has them")
            epoch_a = first.ha.status()["epoch"]

            # B stops taking records in (it drops them; it still answers pings), and A, whose
            # 0.5 s to declare it ineligible are stretched here, crashes before they commit.
            async def deaf(action: Any, durable: Any) -> None:
                return None

            second.replication._do = deaf
            first.replication.rule.ack_timeout = 3600.0
            lost = [first.state.append("ns", f"lost{n}", n) for n in range(3)]
            tail_end = lost[-1].lsn
            await wait_until(lambda: first.state.durable >= tail_end, what="the tail on A's disk")
            assert first.state.status()["uncommitted"] == 3
            assert rack.ineligible(a) == []
            await rack.crash(a)
            del second.replication._do

            await wait_until(lambda: rack.actives() == [b], timeout=5, what="B takes over")
            epoch_b = second.ha.status()["epoch"]
            assert epoch_b > epoch_a
            holds(second.state, "ns", acked)
            assert all(second.state.get("ns", f"lost{n}") is None for n in range(3))
            for n in range(40):
                await second.state.put("ns", f"b{n}", n)  # committed alone: A is ineligible
                acked[f"b{n}"] = n
            await second.state.put("ns", "a0", "overwritten by B")
            acked["a0"] = "overwritten by B"

            first = await rack.start(a)
            assert first.state.last() == tail_end  # the tail is in its log as it comes back
            await wait_until(lambda: rack.counted(b, a), timeout=20,
                             what="A to follow B and count again")  # fmt: skip
            assert rack.actives() == [b]
            assert first.state.tables.data == second.state.tables.data
            assert all(first.state.get("ns", f"lost{n}") is None for n in range(3))
            assert first.state.base == 50  # its log rewritten up to the cut, then fed by records
            holds(first.state, "ns", acked)

            first.ha.promote({})  # fail-back: B hands the lease over
            await wait_until(lambda: rack.actives() == [a], timeout=10, what="the hand-over")
            assert first.ha.status()["epoch"] > epoch_b
            for n in range(20):
                await first.state.put("ns", f"c{n}", n)
                acked[f"c{n}"] = n
            await wait_until(lambda: rack.counted(a, b), what="B to follow A")
            for store in (first.state, second.state):
                holds(store, "ns", acked)
                assert all(store.get("ns", f"lost{n}") is None for n in range(3))
            assert first.state.tables.data == second.state.tables.data
            assert first.state.position == second.state.position
            # A's tail took LSNs 51-53 in its epoch; B wrote its own there, A kept B's
            assert first.state.position.lsn == 50 + 40 + 1 + 20
            nursery.cancel_scope.cancel()


# -- a standby's link while it acknowledges -------------------------------------------------


def leaves(group: BaseException) -> list[BaseException]:
    """Every exception inside ``group``, with their causes."""
    out: list[BaseException] = []
    todo = [group]
    while todo:
        exc = todo.pop()
        out.append(exc)
        todo.extend(getattr(exc, "exceptions", ()))
        if exc.__cause__ is not None:
            todo.append(exc.__cause__)
    return out


async def test_a_standby_answering_pings_while_it_acknowledges_keeps_running(tmp_path, monkeypatch):
    """Two tasks sending on one link at once (a pong, an acknowledgement) raised
    BusyResourceError, which stopped the node (fixed in 5ee8bbd: one sender per link).
    The active pings its standby every 2 ms (1 s by default) while it commits 300 records
    one by one, each acknowledged: the standby answers both on one link and keeps running,
    with everything."""
    from appliance.state import service as service_module

    monkeypatch.setattr(service_module, "PING_INTERVAL", 0.002)
    failures: list[BaseException] = []
    real_run = state_plugin.run

    async def run(node: Any, **kw: Any) -> None:  # the state service, its failure kept
        try:
            await real_run(node, **kw)
        except BaseException as exc:
            failures.extend(leaves(exc))
            raise

    monkeypatch.setattr(state_plugin, "run", run)
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                rack, first, second = await up(tmp_path, nursery, monkeypatch)
                active = rack.nodes[first]
                for n in range(300):
                    await active.state.put("ns", f"k{n}", n)
                await wait_until(lambda: rack.counted(first, second), what="the standby")
                assert not rack.gone[second].is_set()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup:
        busy = [e for e in failures if isinstance(e, trio.BusyResourceError)]
        if busy:
            pytest.fail(f"a node's state service failed: {busy[0]!r}")
        raise
