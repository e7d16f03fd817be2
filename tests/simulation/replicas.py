"""Replication in the simulation: every appliance keeps its state in a real
:class:`~appliance.state.store.StateStore` over a simulated disk, runs the real
replication shell (:class:`appliance.state.service.Replication`: its follow loop,
``_stream_from``, ``_lead``, send loop, acknowledgements and ``refresh_eligibility``,
driving the real :class:`~appliance.state.replication.LeaderStream`,
:class:`~appliance.state.replication.FollowerStream` and
:class:`~appliance.state.commit.CommitRule`) over in-memory links, and serves a
perfdhcp-like workload; what it does is checked as it happens
(checker.py, :class:`~tests.simulation.checker.StateChecker`).

What is modelled:

* **the disk** (:class:`DiskHandle` over tests/support/memlog.py): the store's blocking
  calls run on the mock clock. An append is in the page cache at once and durable only
  after an fsync delay (0.5-4 ms, with jitter; a ``slow-disk`` fault makes it 50-800
  ms for a while); a rewrite (compaction, a cut, a snapshot installed) is atomic after
  its delay. A kill is a power loss: what is not durable is lost, a torn prefix of it
  may remain, and the next life opens the log with the real reader (``read_entries``)
  and rebuilds its tables from it. A process may be stopped in the middle of an fsync
  (step ``fsync``: the VM is frozen, the disk waits too) or right after it (step
  ``fsynced``: durable, the store not told yet);
* **the links**: the shell's TLS streams become :class:`Link` ends over
  :class:`LinkNet`, which behaves as TCP does over the simulation's network: frames in
  order, delayed as ``Faults.delay``/``slow``/``late`` say, a lost frame retransmitted
  after 0.2 s (doubling, at most 1 s: shorter than TCP's, so links recover within the
  healing time), duplicates absorbed, a cut direction holding its frames until it heals,
  a connection attempt retried at 1 and 3 s and given up after the shell's 5 s. A
  killed machine's connections say nothing (or, half the time, send their FIN as a
  process crash would); a restarted one answers their next segment with a reset.
  Messages are msgpack-encoded and decoded between the ends; **signing is left out**
  (appliance/state/signing.py is tested on its own, tests/unit/state/test_signing.py):
  a link carries the payloads the signed frames would;
* **clocks**: service.py's ``trio.current_time()``, deadlines and sleeps run on the node's
  own drifting clock, and ``time.time()`` is the node's wall clock (its rate, plus an
  offset a ``clock-step`` fault moves by 12-40 s), so the pings' skew estimate and the
  ``max_clock_skew`` rule are exercised;
* **the workload** (:class:`Clients`, :class:`Server`): clients ask every appliance, as
  DHCP broadcasts would; the one whose fence says yes allocates the lowest address free
  in its committed table (and not in flight), or renews the client's own, or deletes
  the client's on a release, with ``store.append(..., on_commit)``: a write is
  acknowledged only when ``on_commit`` gets a position.

The shell is service.py's own, but for its TLS parts (``run``, ``_inbound``,
``_follow``: the same logic over :class:`Link`). Bugs it found, fixed there and
put back by mutations (mutations.py): a new holder cleared whom the previous
holder had declared ineligible (acknowledged writes lost at a later failover); a
standby took its floor for frame epochs once, at hello (a deposed leader's late
frames accepted); a standby followed for ever a leader that vanished without
closing the link; the leader's send loop spun until the follower's ``from`` came.
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import msgpack
import trio

import appliance.state.service as service_module
import appliance.state.store as store_module
from appliance.frames import frame
from appliance.state.records import Record, unpack_untrusted
from appliance.state.service import LINK_ERRORS, Replication
from appliance.state.signing import MAX_FRAME, Refused
from appliance.state.store import NotWriter, StateStore
from tests.support.memlog import MemLog

CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("process", default=None)
WALL_BASE = 1.8e9  # the wall clocks' epoch seconds at true time 0
FSYNC = (0.0005, 0.004)  # s
SLOW_FSYNC = (0.05, 0.8)
RTO = (0.2, 1.0)  # a lost or held frame is sent again after this long, doubling, at most
SYN_RETRIES = (1.0, 2.0)  # s between connection attempts (Linux's SYN retransmissions)
CONNECT_TIMEOUT = service_module.HANDSHAKE_TIMEOUT
COMPACT_MIN_RECORDS = 300  # store.py's 4096 lowered: compactions and snapshots happen
NS = "leases"


# -- service.py on the node's own clocks ---------------------------------------------------


class NodeTrio:
    """``trio`` as appliance/state/service.py sees it here: ``current_time``, ``move_on_at``
    and ``sleep`` on the calling node's drifting clock (the election's clock too: a real
    node's monotonic clock is trio's), and a sleep is a step where a pause may land."""

    def __getattr__(self, name: str) -> Any:
        return getattr(trio, name)

    @staticmethod
    def current_time() -> float:
        process = CURRENT.get()
        return process.clock.now() if process is not None else trio.current_time()

    @staticmethod
    def move_on_at(deadline: float) -> trio.CancelScope:
        process = CURRENT.get()
        at = process.clock.to_trio(deadline) if process is not None else deadline
        return trio.move_on_at(at if not math.isnan(at) else math.inf)

    @staticmethod
    async def sleep(seconds: float) -> None:
        process = CURRENT.get()
        if process is None:
            await trio.sleep(seconds)
            return
        await trio.sleep(seconds / process.clock.rate)
        await process.gate()
        await trio.lowlevel.checkpoint_if_cancelled()


class NodeWall:
    """``time`` as service.py sees it: ``time()`` is the calling node's wall clock."""

    @staticmethod
    def time() -> float:
        process = CURRENT.get()
        if process is None:
            return WALL_BASE + trio.current_time()
        return WALL_BASE + process.wall_offset + process.clock.rate * trio.current_time()


@contextlib.contextmanager
def patched():
    """For a replicated run: service.py on the nodes' clocks."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(service_module, "trio", NodeTrio()))
        stack.enter_context(mock.patch.object(service_module, "time", NodeWall()))
        stack.enter_context(
            mock.patch.object(store_module, "COMPACT_MIN_RECORDS", COMPACT_MIN_RECORDS)
        )
        yield


# -- the disk --------------------------------------------------------------------------


class DiskHandle:
    """One life's access to its appliance's disk (a :class:`MemLog` that outlives it): the
    ``blocking`` callable StateStore runs its file I/O through, on the mock clock."""

    def __init__(self, process, rng: random.Random) -> None:
        self.process = process
        self.log: MemLog = process.statelog
        self.rng = rng

    def latency(self) -> float:
        slow = trio.current_time() < self.process.slow_disk_until
        return self.rng.uniform(*(SLOW_FSYNC if slow else FSYNC))

    async def run(self, fn: Callable, *args: Any) -> Any:
        process, log = self.process, self.log
        await process.gate()
        await trio.lowlevel.checkpoint_if_cancelled()
        if fn == log.journal.append:
            data, _count = args
            log.write(data)
            process.fsyncs += 1
            total, split = self.latency(), self.rng.random()
            try:
                await trio.sleep(total * split)
                await process.gate("fsync")  # a frozen VM: the disk waits with it
                await trio.sleep(total * (1 - split))
                await trio.lowlevel.checkpoint_if_cancelled()  # killed meanwhile: not durable
                log.sync()
            finally:
                process.fsyncs -= 1
            await process.gate("fsynced")  # durable; the store not told yet
            await trio.lowlevel.checkpoint_if_cancelled()
            return None
        if fn == log.journal.rewrite:
            data = b"".join(frame(p) for p in args[0])
            await trio.sleep(2 * self.latency())
            await trio.lowlevel.checkpoint_if_cancelled()
            log.replace(data)
            process.world.checker.seen["log files rewritten"] += 1
            await process.gate("fsynced")
            await trio.lowlevel.checkpoint_if_cancelled()
            return None
        await trio.sleep(self.latency() / 4)  # a read (tables_upto)
        await trio.lowlevel.checkpoint_if_cancelled()
        return fn(*args)


class SimStore(StateStore):
    """The real store; each commit is shown to the checker (which records it applied)."""

    process: Any = None

    def advance(self) -> None:
        may = max(0, self.durable - self.tables.lsn)  # nothing past the durable LSN commits
        head = [(r, ours) for r, _, ours in itertools.islice(self.uncommitted, may)]
        before, leading = self.tables.lsn, self.fence.ok()
        super().advance()
        applied = self.tables.lsn - before
        if applied > 0 and self.process is not None:
            self.process.world.checker.state.applied(self.process, head[:applied], leading)


# -- links ----------------------------------------------------------------------------


FIN = object()  # the end of a direction's frames (the sender closed)


class Direction:
    """One way of a link: frames in order, each ``[due, frame]``."""

    def __init__(self, src: Link, dst: Link) -> None:
        self.src, self.dst = src, dst
        self.queue: deque[list] = deque()
        self.rto = RTO[0]


class Link:
    """One end of a connection: what appliance/state/service.py's ``Link`` offers the shell
    (``send``, ``receive``, ``peer``), without TLS or signatures."""

    def __init__(self, net: LinkNet, owner, peer: str, *, leader: bool):
        self.net, self.owner, self.peer = net, owner, peer
        self.incarnation = owner.incarnation
        self.leader = leader  # the leader's end (its sends are the fenced ones)
        self.out: Direction | None = None
        self.inbox: deque[bytes] = deque()
        self.arrived = trio.Event()
        self.closed = False  # by its owner
        self.dead = False  # its machine lost power
        self.peer_closed = False  # a FIN arrived
        self.reset = False  # an RST arrived
        self.state = owner.state
        self.state.links[self] = None

    async def send(self, message: list[Any]) -> None:
        await self.owner.gate("replicate" if self.leader else "woke")
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.closed or self.dead:
            raise trio.ClosedResourceError("closed")
        if self.reset:
            raise trio.BrokenResourceError("connection reset")
        if self.leader and message and message[0] == "records":
            self.owner.world.checker.seen["record frames sent"] += 1
        self.net.transmit(self.out, msgpack.packb(message, use_bin_type=True))

    async def receive(self) -> Any:
        while not self.inbox:
            if self.reset:
                raise trio.BrokenResourceError("connection reset")
            if self.peer_closed:
                raise trio.BrokenResourceError("closed by the peer")
            if self.closed or self.dead:
                raise trio.ClosedResourceError("closed")
            self.arrived = trio.Event()
            await self.arrived.wait()
        data = self.inbox.popleft()
        await self.owner.gate()
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            message = unpack_untrusted(data, MAX_FRAME)
        except ValueError as exc:
            raise Refused("malformed", str(exc)) from None
        if not self.leader and isinstance(message, list) and len(message) > 2:
            if message[0] in ("records", "snapshot"):
                self.state.frame_epoch = message[1]
            elif message[0] == "end":
                self.state.leader_end = message[2]
        return message

    def close(self, fin: bool = True) -> None:
        """The owner closes it (a FIN follows the frames already sent)."""
        if self.closed or self.dead:
            return
        self.closed = True
        self.state.links.pop(self, None)
        if fin:
            self.net.transmit(self.out, FIN)

    def lose_power(self, fin: bool) -> None:
        self.close(fin)
        self.dead = True

    def arrive(self, item) -> None:
        if item is FIN:
            self.peer_closed = True
        elif self.closed:
            self.out.dst.reset = True  # data for a closed socket: a reset back
            self.out.dst.arrived.set()
            return
        else:
            self.inbox.append(item)
        self.arrived.set()


class LinkNet:
    """Connections between appliances over the simulation's network (``Faults``), as TCP."""

    def __init__(self, world, rng: random.Random) -> None:
        self.world = world
        self.rng = rng
        self.listeners: dict[str, Callable[[Link], bool]] = {}  # name -> accept
        self._heap: list = []
        self._seq = itertools.count()
        self._wake = trio.Event()

    async def connect(self, process, peer: str) -> Link:
        """Dial ``peer``: OSError at once if its machine is up but nobody listens (a reset),
        trio.TooSlowError if no answer comes within the shell's handshake timeout."""
        faults, world = self.world.network.faults, self.world
        waits = iter(SYN_RETRIES)
        started = trio.current_time()
        while True:
            other = world.processes[peer]
            cut = (process.name, peer) in faults.cut or (peer, process.name) in faults.cut
            lost = self.rng.random() < faults.drop
            if other.alive and not cut and not lost:
                break
            wait = next(waits, None)
            if wait is None or trio.current_time() + wait - started >= CONNECT_TIMEOUT:
                await trio.sleep(max(0.0, started + CONNECT_TIMEOUT - trio.current_time()))
                raise trio.TooSlowError(f"no answer from {peer}")
            await trio.sleep(wait)
        # SYN, SYN/ACK, then the TLS handshake: about three round trips
        await trio.sleep(6 * self.rng.uniform(*faults.delay))
        await process.gate()
        await trio.lowlevel.checkpoint_if_cancelled()
        accept = self.listeners.get(peer)
        other = world.processes[peer]
        if accept is None or not other.alive:
            raise ConnectionRefusedError(f"{peer} does not listen")
        mine = Link(self, process, peer, leader=False)
        theirs = Link(self, other, process.name, leader=True)
        mine.out, theirs.out = Direction(mine, theirs), Direction(theirs, mine)
        if not accept(theirs):
            raise ConnectionRefusedError(f"{peer} does not listen")
        return mine

    def transmit(self, direction: Direction, item) -> None:
        faults, rng = self.world.network.faults, self.rng
        src, dst = direction.src.owner.name, direction.dst.owner.name
        now = trio.current_time()
        due = now + rng.uniform(*faults.delay) + faults.slow.get((src, dst), 0.0)
        if faults.late[1] and direction.dst.owner.active:
            due += rng.uniform(*faults.late)
        rto = RTO[0]
        while faults.drop and rng.random() < faults.drop:
            self.world.checker.seen["replication frames lost and sent again"] += 1
            due, rto = due + rto, min(RTO[1], 2 * rto)
        if faults.duplicate and rng.random() < faults.duplicate:
            self.world.checker.seen["replication frames duplicated (dropped by TCP)"] += 1
        if direction.queue:
            due = max(due, direction.queue[-1][0])
        direction.queue.append([due, item])
        if len(direction.queue) == 1:
            self._schedule(direction)

    def _schedule(self, direction: Direction) -> None:
        heapq.heappush(self._heap, (direction.queue[0][0], next(self._seq), direction))
        self._wake.set()

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            while self._heap and self._heap[0][0] <= now:
                _, _, direction = heapq.heappop(self._heap)
                self._due(direction, now)
            self._wake = trio.Event()
            with trio.move_on_at(self._heap[0][0] if self._heap else math.inf):
                await self._wake.wait()

    def _due(self, direction: Direction, now: float) -> None:
        head = direction.queue[0]
        dst = direction.dst
        owner = dst.owner
        held = (direction.src.owner.name, owner.name) in self.world.network.faults.cut
        if held or not owner.alive:  # cut, or its machine is down: sent again later
            head[0] = now + direction.rto
            direction.rto = min(RTO[1], 2 * direction.rto)
            self._schedule(direction)
            return
        direction.rto = RTO[0]
        direction.queue.popleft()
        if dst.dead or dst.incarnation != owner.incarnation:
            if head[1] is not FIN:  # the restarted machine knows no such connection
                direction.src.reset = True
                direction.src.arrived.set()
            direction.queue.clear()
            return
        dst.arrive(head[1])
        if direction.queue:
            direction.queue[0][0] = max(direction.queue[0][0], now)
            self._schedule(direction)


# -- the replication shell ------------------------------------------------------------


class SimReplication(Replication):
    """service.py's :class:`Replication` with its TLS parts (``run``, ``_inbound``,
    ``_follow``) replaced by the same logic over :class:`Link`; everything else is the real
    shell."""

    def __init__(self, state: NodeState, peers: list[str]) -> None:
        process = state.process
        node = SimpleNamespace(fence=process.fence, cluster=None)
        super().__init__(node, state.store, {p: (p, 0) for p in peers}, "sim", 0)
        self.state = state
        self.process = process
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.state.net.listeners[self.process.name] = self._accept
            nursery.start_soon(self._follow_loop)
            nursery.start_soon(self._eligibility_loop)
            task_status.started()

    def _accept(self, link: Link) -> bool:
        if self._nursery is None or not self.process.alive:
            return False
        self._nursery.start_soon(self._inbound_link, link)
        return True

    async def _inbound_link(self, link: Link) -> None:
        """service.py ``_inbound`` after the TLS handshake."""
        CURRENT.set(self.process)  # started by the dialling node's task: ours from here on
        peer = link.peer
        stream = scope = None
        try:
            fence = self.node.fence
            if not fence.ok():
                await link.send(["not-leader"])
                return
            with trio.CancelScope() as scope:
                self._links[peer] = scope
                self.process.world.note(f"lead {self.process.name}>{peer} epoch {fence.epoch}")
                stream = service_module.LeaderStream(self.store, fence.epoch)
                await self._lead(link, stream)
        except* Refused as group:
            self._refused_all(group, peer)
        except* LINK_ERRORS as group:
            self._ended(group, peer)
        finally:
            self.process.world.note(f"led {self.process.name}>{peer} ends")
            # only this link's entries: a newer link from the same standby keeps its own
            if stream is not None and self.followers.get(peer) is stream:
                del self.followers[peer]
            if scope is not None and self._links.get(peer) is scope:
                del self._links[peer]
            link.close()

    async def _follow(self, peer: str, address: tuple[str, int]) -> bool:
        """service.py ``_follow`` without TLS."""
        note = self.process.world.note
        try:
            link = await self.state.net.connect(self.process, peer)
        except (OSError, trio.TooSlowError) as exc:
            note(f"dial {self.process.name}>{peer} fails: {type(exc).__name__}")
            return False
        note(f"follow {self.process.name}>{peer} at {self.store.position.lsn}")
        try:
            await self._stream_from(link)
            return True
        except* Refused as group:
            self._refused_all(group, peer)
        except* LINK_ERRORS as group:
            self._ended(group, peer)
            ends = {type(e).__name__ for e in service_module._leaves(group)}
            if "TooSlowError" in ends:
                self.process.world.checker.seen["standby links silent, dropped"] += 1
            note(f"followed {self.process.name}>{peer} ends: " + "; ".join(sorted(ends)))
        finally:
            self.following = {}
            link.close()
        return False

    def _refused_all(self, group: BaseExceptionGroup, peer: str) -> None:
        super()._refused_all(group, peer)
        for exc in service_module._leaves(group):
            reason = exc.reason if isinstance(exc, Refused) else "malformed"
            self.process.world.checker.seen[f"replication frames refused: {reason}"] += 1
            self.process.world.note(f"refused {self.process.name}<{peer} {exc}")

    async def _do(self, action: Any, durable: Any) -> None:
        checker = self.process.world.checker
        if isinstance(action, service_module.Append | service_module.Install):
            checker.state.accepted(self.process, self.state.frame_epoch)
        if isinstance(action, service_module.Append):
            for record in action.records:
                self.state.sent_under[record.lsn] = self.state.frame_epoch
        note = self.process.world.note
        if isinstance(action, service_module.Truncate):
            end = self.state.leader_end
            note(f"cut {self.process.name} after {action.lsn} (leader's end {end})")
            if end is not None and end < 0:
                checker.seen["logs cut to start again from a snapshot"] += 1
            else:
                checker.seen["divergent tails cut"] += 1
                checker.state.cutting(self.process, action.lsn)
        elif isinstance(action, service_module.Install):
            note(f"install {self.process.name} snapshot at {action.head.lsn}")
            checker.seen["snapshots installed"] += 1
        await super()._do(action, durable)


class NodeState:
    """One life of an appliance's state: its store, replication and DHCP-like server."""

    def __init__(self, process, net: LinkNet) -> None:
        world = process.world
        self.process = process
        self.net = net
        rng = random.Random(world.rng.random())
        self.disk = DiskHandle(process, rng)
        self.store = SimStore(Path(str(process.statelog.path)).parent, process.fence,
                              log=process.statelog, blocking=self.disk.run)  # fmt: skip
        self.store.process = process
        self.replication = SimReplication(self, world.peers_of(process.name))
        self.replication.known_epoch = lambda: process.disk.epoch
        self.server = Server(self)
        self.frame_epoch: int | None = None  # of the last records or snapshot frame received
        self.leader_end: int | None = None  # where the leader said the follower's epoch ends
        self.sent_under: dict[int, int | None] = {}  # lsn -> epoch of the frame it came in
        self.links: dict[Link, None] = {}  # open ends this life owns, in order
        self.store.load()  # the real read path: what the durable bytes hold
        world.checker.state.loaded(process)

    async def run(self, election, runner) -> None:
        store = self.store
        replication = self.replication
        replication.election, replication.poke_election = election, runner.poke
        store.policy = replication
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            await nursery.start(replication.run)
            nursery.start_soon(self.server.run)

    def power_lost(self, rng: random.Random) -> None:
        lost = self.process.statelog.crash(rng)
        self.process.world.note(f"power lost {self.process.name}: {lost} bytes not durable")
        if lost:
            self.process.world.checker.seen["kills that lost bytes not yet durable"] += 1
        fin = rng.random() < 0.5  # a process crash closes its sockets; a power cut does not
        for link in list(self.links):
            link.lose_power(fin)
        self.net.listeners.pop(self.process.name, None)


# -- the workload ---------------------------------------------------------------------


class Server:
    """A DHCP-like plugin on one appliance: answers only while its fence says yes."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self.process = state.process
        self.inbox_send, self.inbox = trio.open_memory_channel[list](64)
        self.pending: dict[str, str] = {}  # address -> client, appended and not committed yet

    def deliver(self, burst: list[tuple]) -> None:
        with contextlib.suppress(trio.WouldBlock):
            self.inbox_send.send_nowait(burst)

    async def run(self) -> None:
        process = self.process
        async for burst in self.inbox:
            await process.gate()
            await trio.lowlevel.checkpoint_if_cancelled()
            for request in burst:
                if process.fence.ok():  # each answer asks the fence
                    self.handle(*request)

    def handle(self, kind: str, client: str, address: str | None) -> None:
        store, checker = self.state.store, self.process.world.checker
        leases = store.tables.data.get(NS, {})
        if client in self.pending.values():
            return  # its last request is on its way
        if kind == "release":
            if address is None or leases.get(address) != client or address in self.pending:
                return
            value = None
        else:
            value = client
            address = next((a for a, c in leases.items() if c == client), None)
            if address is not None and address in self.pending:
                # Another client's record of it waits to commit (the committed table is
                # behind, e.g. records inherited from the previous leader): the pending
                # overlay wins, as the DHCP plugin's does.
                checker.seen["requests deferred: their address pending for another"] += 1
                return
            if address is None:
                pool = self.process.world.clients.pool
                address = next((a for a in pool if a not in leases and a not in self.pending), None)
                if address is None:
                    checker.seen["requests refused: pool exhausted"] += 1
                    return
        self.pending[address] = client
        try:
            record = store.append(NS, address, value, lambda position: committed(position))
        except NotWriter:
            self.pending.pop(address, None)
            return
        checker.state.appended(self.process, record)

        def committed(position) -> None:
            self.pending.pop(address, None)
            if position is not None:
                checker.state.acknowledged(self.process, record, client)


class Clients:
    """perfdhcp-like: bursts of requests and releases from many clients, continuously, at a
    rate the seed picks; a burst reaches every active appliance at once (a broadcast; the
    others would drop it, their fence says no) after one network delay."""

    def __init__(self, world, rng: random.Random) -> None:
        self.world = world
        self.rng = rng
        self.bursts = rng.choice([10.0, 20.0, 40.0])  # per second
        self.burst = rng.choice([4, 8])  # requests in a burst, at most
        self.count = rng.choice([24, 64, 160])
        self.pool = [f"10.0.{n // 256}.{n % 256}" for n in range(1, 1 + 2 * self.count)]
        self.held: dict[str, str] = {}  # client -> address, as acknowledged
        self.running = True
        self._heap: list = []
        self._seq = itertools.count()
        self._wake = trio.Event()

    async def run(self) -> None:
        rng, world = self.rng, self.world
        while self.running:
            await trio.sleep(rng.expovariate(self.bursts))
            burst = []
            for _ in range(rng.randint(1, self.burst)):
                client = f"c{rng.randrange(self.count)}"
                address = self.held.get(client)
                release = address is not None and rng.random() < 0.3
                burst.append(("release" if release else "request", client, address))
            faults = world.network.faults
            at = trio.current_time() + rng.uniform(*faults.delay)
            for name in world.names:
                process = world.processes[name]
                if process.state is not None and process.active and rng.random() >= faults.drop:
                    heapq.heappush(self._heap, (at, next(self._seq), process.state, burst))
                    self._wake.set()

    async def deliver(self) -> None:
        """Bursts reach the servers when due (a server of a life since ended gets none)."""
        while True:
            now = trio.current_time()
            while self._heap and self._heap[0][0] <= now:
                _, _, state, burst = heapq.heappop(self._heap)
                if state.process.state is state and state.process.alive:
                    state.server.deliver(burst)
            self._wake = trio.Event()
            with trio.move_on_at(self._heap[0][0] if self._heap else math.inf):
                await self._wake.wait()

    def acknowledged(self, record: Record, client: str) -> None:
        if record.value is not None:
            self.held[client] = record.key
        elif self.held.get(client) == record.key:
            del self.held[client]
