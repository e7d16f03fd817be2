"""A whole rack in one ``trio.run``: appliances and witnesses running the real
election shell (:class:`ElectionRunner`, :class:`WitnessRunner`) over an
in-memory network, each with its own drifting clock, each a process that can
be killed, restarted, reconfigured, commanded by an operator and paused at any
of its steps; and a fenced resource that the holders' outward effects reach.

Everything random comes from one seeded ``random.Random``, trio's scheduler
is made deterministic and seeded from it too, so a seed replays the same
run: :attr:`World.digest` hashes every send, delivery and event to prove it.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import random
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import trio
import trio.testing

from appliance.ha.election import AcceptorSet, Election
from appliance.ha.fence import Fence
from appliance.ha.messages import Accepted, Handover, Prepare, Promise, Propose
from appliance.ha.proposer import Acquired, Lost, Renewed
from appliance.ha.runner import ElectionRunner, WitnessRunner
from appliance.ha.schema import Timing
from tests.simulation.checker import Checker
from tests.simulation.replicas import CURRENT, Clients, LinkNet, NodeState
from tests.support.memlog import MemLog

ADVERSARY = "adversary"  # the replaying box's address
RESOURCE = "resource"  # where outward effects go
KEPT = 8  # frames the adversary keeps per message type: the latest, and a sample of all


@dataclass
class DriftClock:
    """A node's monotonic clock: ``offset + rate * true time``."""

    rate: float
    offset: float

    def now(self) -> float:
        return self.offset + self.rate * trio.current_time()

    def to_trio(self, local: float) -> float:
        """The first instant of true time at which this clock reads ``local`` or later.
        Rounded to nearest, a deadline could wake its task one ulp early: the task finds
        its lease still valid, arms the same deadline and the mock clock never moves."""
        at = (local - self.offset) / self.rate
        while self.offset + self.rate * at < local:
            at = math.nextafter(at, math.inf)
        return at


@dataclass
class Faults:
    drop: float = 0.0
    duplicate: float = 0.0
    delay: tuple[float, float] = (0.0002, 0.002)
    cut: set[tuple[str, str]] = field(default_factory=set)  # (from, to): everything lost
    slow: dict[tuple[str, str], float] = field(default_factory=dict)  # (from, to): extra delay
    late: tuple[float, float] = (0.0, 0.0)  # extra delay of everything sent to an active node


@dataclass(frozen=True)
class Effect:
    """An outward effect, sent to the fenced resource under the epoch the fence named."""

    TYPE: ClassVar[str] = "effect"
    req: int
    epoch: int
    tenure: int  # the checker's truth (which holding it was checked under): not for the resource


class Resource:
    """The receiver of outward effects, fenced by epoch (as the replicated state log will
    be): it rejects an effect whose epoch is below the highest it has accepted."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.highest = 0

    def deliver(self, sender: str, address: str, effect: Effect) -> None:
        accepted = effect.epoch >= self.highest
        self.highest = max(self.highest, effect.epoch)
        self.world.note(f"resource {'accepts' if accepted else 'rejects'} {sender} {effect.epoch}")
        self.world.checker.resource(sender, effect, accepted)


class Network:
    """Datagrams between named endpoints, delivered in time order (reordered by random delays)."""

    def __init__(self, world: World, faults: Faults) -> None:
        self.world = world
        self.rng = world.rng
        self.faults = faults
        self.endpoints: dict[str, object] = {}  # name -> its .deliver, while it listens
        self._heap: list = []
        self._seq = itertools.count()
        self._wake = trio.Event()
        self.sent = 0
        self.latest: dict[str, deque] = {}  # what the adversary captured, per message type
        self.sample: dict[str, list] = {}
        self._captured: dict[str, int] = {}
        self.targeted = False  # the adversary also replays answers to matching rounds
        self._answers: dict[tuple[str, int], dict[str, tuple[str, object]]] = {}
        self._targeted: set[tuple[str, str, int]] = set()

    def send(self, src: str, dst: str, message) -> None:
        self.sent += 1
        if isinstance(message, Accepted) and message.ok:
            self.world.checker.accepted(self.world.processes[src], message.promised_by, message.req)
        if dst != RESOURCE:
            self._capture(src, message)
        if self.targeted:
            self._replay_answers(src, dst, message)
        faults = self.faults
        if (src, dst) in faults.cut or self.rng.random() < faults.drop:
            return
        copies = 2 if self.rng.random() < faults.duplicate else 1
        for _ in range(copies):
            at = trio.current_time() + self.rng.uniform(*faults.delay)
            at += faults.slow.get((src, dst), 0.0)
            if faults.late[1] and getattr(self.world.processes.get(dst), "active", False):
                at += self.rng.uniform(*faults.late)
            self._push(at, src, dst, message, src)

    def _push(self, at: float, src: str, dst: str, message, address: str) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), src, dst, message, address))
        self._wake.set()

    def _replay_answers(self, src: str, dst: str, message) -> None:
        """The targeted adversary: the answers an acceptor gave one proposer's round go to
        another proposer as soon as it asks with the same request id (request ids of two
        appliances that booted as often coincide)."""
        if isinstance(message, Promise | Accepted) and message.ok:
            self._answers.setdefault((message.TYPE, message.req), {})[src] = (dst, message)
            return
        answer = {Prepare: "promise", Propose: "accepted"}.get(type(message))
        if answer is None or (src, answer, message.req) in self._targeted:
            return
        self._targeted.add((src, answer, message.req))
        for acceptor, (asked, captured) in self._answers.get((answer, message.req), {}).items():
            if asked != src:
                self.world.checker.seen[f"targeted replays ({answer})"] += 1
                self._push(trio.current_time() + 0.001, acceptor, src, captured, ADVERSARY)

    def _capture(self, src: str, message) -> None:
        """Keep the latest frames of each type, and a uniform sample of all of them."""
        kind = message.TYPE
        self.latest.setdefault(kind, deque(maxlen=KEPT)).append((src, message))
        sample = self.sample.setdefault(kind, [])
        seen = self._captured[kind] = self._captured.get(kind, 0) + 1
        if len(sample) < KEPT:
            sample.append((src, message))
        elif (slot := self.rng.randrange(seen)) < KEPT:
            sample[slot] = (src, message)

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            while self._heap and self._heap[0][0] <= now:
                _, _, src, dst, message, address = heapq.heappop(self._heap)
                endpoint = self.endpoints.get(dst)
                if endpoint is None or (address == src and (src, dst) in self.faults.cut):
                    continue  # nobody listens, or the cable was cut while it flew
                self.world.note(f"deliver {address}>{dst} {message.TYPE} {message.req}")
                endpoint.deliver(src, address, message)
            self._wake = trio.Event()
            with trio.move_on_at(self._heap[0][0] if self._heap else math.inf):
                await self._wake.wait()

    async def adversary(self) -> None:
        """A box on the network that replays any captured frame, signatures intact, to any
        node; the answers go to its own address, where nobody listens."""
        while True:
            await trio.sleep(self.rng.uniform(0.05, 0.5))
            if not self.latest:
                continue
            kind = self.rng.choice(sorted(self.latest))
            frames = self.latest[kind] if self.rng.random() < 0.5 else self.sample[kind]
            src, message = self.rng.choice(frames)
            dst = self.rng.choice(sorted(self.world.processes))
            endpoint = self.endpoints.get(dst)
            if endpoint is not None and dst != src:
                self.world.checker.seen[f"replayed {kind}"] += 1
                self.world.note(f"replay {src}>{dst} {message.TYPE} {message.req}")
                endpoint.deliver(src, ADVERSARY, message)


@dataclass
class Disk:
    """What an appliance keeps in ``ha/state.json`` (appliance/ha/service.py ``Durable``)."""

    epoch: int = 0
    longest_lease: float = 0.0
    confirmed: str = ""  # the membership every peer was seen to share
    ineligible: frozenset[str] = frozenset()  # the last proposal its acceptor accepted named


@dataclass
class Trap:
    """Stop the process at its next ``step`` (a SIGSTOP that lands right there)."""

    step: str
    seconds: float


class Process:
    """One appliance or witness: killed, restarted, paused; its disk survives (appliances).

    Its steps, where a pause may land (:meth:`gate`): ``woke`` (a task woke up),
    ``persist`` (the acceptor's new epoch is on disk, its answer not sent yet), ``sent``
    (the runner sent what the election queued, its events are not applied yet),
    ``checked`` (a plugin's fence said yes, the datagram has not left yet)."""

    def __init__(self, world: World, name: str, witness: bool, rate: float, timing: Timing):
        self.world = world
        self.name = name
        self.witness = witness
        self.timing = timing  # its [ha] timings: an operator may change them between lives
        self.clock = DriftClock(rate, world.rng.uniform(0, 1000))
        self.disk = Disk()
        self.listed_witnesses: list[str] | None = None  # its [ha] witnesses, if not the world's
        self.fence = Fence(self.clock.now)
        self.active = False  # the role the shell gives the node
        self._acting = trio.Event()  # set while active
        self.scope: trio.CancelScope | None = None
        self.runner: ElectionRunner | WitnessRunner | None = None
        self.paused_at: float | None = None
        self._resumed = trio.Event()
        self.trap: Trap | None = None
        self.incarnation = 0
        self.forced: set[int] = set()  # rounds (request ids) an operator forced
        self._force_next = False  # the next prepare this node sends is the forced round
        self._round = None  # the proposer's round when the last answer came in
        self._delivered: tuple[str, object] | None = None  # the last (sender, message) fed
        # Replicated runs (replicas.py): the state log's disk, which outlives each life, and
        # each life's store, replication and server.
        self.statelog = MemLog(name) if world.replicated and not witness else None
        self.state: NodeState | None = None
        self.wall_offset = 0.0  # its wall clock minus true time (a clock-step fault moves it)
        self.slow_disk_until = 0.0
        self.fsyncs = 0  # in flight

    @property
    def alive(self) -> bool:
        return self.scope is not None

    @property
    def election(self) -> Election | None:
        return getattr(self.runner, "election", None)

    async def gate(self, step: str = "woke") -> None:
        """A step of the process: a trap set for it stops the process here."""
        if self.trap is not None and self.trap.step == step and self.paused_at is None:
            self.world.checker.seen[f"pauses at {step}"] += 1
            self.pause(self.trap.seconds)
            self.trap = None
        while self.paused_at is not None:
            await self._resumed.wait()

    # -- life -----------------------------------------------------------------------

    def start(self) -> None:
        self.incarnation += 1
        self.forced, self._force_next = set(), False  # commands do not survive a restart
        self.world.note(f"start {self.name} #{self.incarnation} lease={self.timing.lease}")
        self.world.nursery.start_soon(self._life)

    async def _life(self) -> None:
        with trio.CancelScope() as scope:
            self.scope = scope
            CURRENT.set(self)  # replicas.py: whose clocks service.py reads
            self.runner = self._witness() if self.witness else self._appliance()
            self.world.network.endpoints[self.name] = self.runner
            if self.statelog is not None:
                self.state = NodeState(self, self.world.links)
            try:
                async with trio.open_nursery() as nursery:
                    if self.state is not None:
                        nursery.start_soon(self.state.run, self.election, self.runner)
                    nursery.start_soon(self.runner.run)
                    if not self.witness:
                        nursery.start_soon(self._outward_effects)
                        nursery.start_soon(self._forget_longer_lease)
            except* Exception as group:
                self._crashed(group)
        if self.scope is scope:
            self.scope = None

    def _crashed(self, group: BaseExceptionGroup) -> None:
        """An exception escaped the real code: a violation, and the process dies."""
        exc = group.exceptions[0]
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {Path(where.filename).name}:{where.lineno} ({where.name})" if where else ""
        self.world.checker.fail(f"{self.name} crashed: {type(exc).__name__}: {exc}{at}")
        self.kill()

    def _witness(self) -> WitnessRunner:
        acceptors = AcceptorSet(self.timing.lease, self.clock.now())
        return WitnessRunner(acceptors, self._send, clock=self.clock, resume=self.gate)

    def _appliance(self) -> ElectionRunner:
        world, disk = self.world, self.disk
        # as service.py does before voting: the restart wait covers the longest lease of
        # any earlier life, and this life's lease is on disk before it grants any
        restart_wait = disk.longest_lease
        if restart_wait > self.timing.lease:
            world.checker.seen["restarts with a shorter lease than before"] += 1
        disk.longest_lease = max(disk.longest_lease, self.timing.lease)
        election = Election(
            self.name, "rack", self.timing, peers=world.peers_of(self.name),
            witnesses=self.listed_witnesses or world.witnesses, now=self.clock.now(),
            known_epoch=disk.epoch, confirmed=disk.confirmed, restart_wait=restart_wait,
            incarnation=self.incarnation, rng=random.Random(world.rng.random()),
            ineligible=disk.ineligible,
        )  # fmt: skip
        self._observe(election)
        return ElectionRunner(
            election, self._send, clock=self.clock, on_event=self._event,
            persist=self._persist, resume=self.gate, confirm=self._confirm,
            persist_ineligible=self._persist_ineligible,
        )  # fmt: skip

    def _observe(self, election: Election) -> None:
        """Note what each answer or request found, to tell which round an event came from."""
        receive = election.receive

        def observed(sender, address, message, now):
            self._round, self._delivered = election.proposer.round, (sender, message)
            receive(sender, address, message, now)

        election.receive = observed

    async def _forget_longer_lease(self) -> None:
        """service.py: once the restart wait is over, only this life's lease needs covering."""
        await trio.sleep_until(self.clock.to_trio(self.election.acceptor.ready_at))
        self.disk.longest_lease = self.timing.lease

    def kill(self) -> None:
        self.world.note(f"kill {self.name}")
        self.world.network.endpoints.pop(self.name, None)
        if self.state is not None:
            if self.fsyncs:
                self.world.checker.seen["kills during an fsync"] += 1
            self.state.power_lost(self.world.rng)
            self.state = None
        if self.scope is not None:
            self.scope.cancel()
            self.scope = None
        self._set_active(False)
        self.fence.revoke()
        self.paused_at, self.trap = None, None
        self._resumed.set()

    def pause(self, seconds: float) -> None:
        self.world.note(f"pause {self.name} for {seconds:.6f}")
        paused_at = self.paused_at = trio.current_time()
        self._resumed = trio.Event()
        self.world.nursery.start_soon(self._resume_after, seconds, paused_at)

    async def _resume_after(self, seconds: float, paused_at: float) -> None:
        await trio.sleep(seconds)
        if self.paused_at == paused_at:  # still that pause (not killed, not resumed)
            self.resume()

    def resume(self) -> None:
        self.world.note(f"resume {self.name}")
        self.paused_at = None
        self._resumed.set()
        if not self.witness and self.alive:
            self.world.nursery.start_soon(self.world.checker.stepped_down_after_pause, self)

    # -- an operator's commands (rackboot ha ..., as service.py applies them) -------------

    def command(self, what: str) -> bool:
        """``promote``, ``force`` (promote --force), ``demote``, ``handover`` (on the holder:
        to a ready standby; elsewhere: ask the holder), ``maintenance on|off``;
        false if not applied (a dead or paused process answers no command)."""
        election = self.election
        if election is None or not self.alive or self.paused_at is not None:
            return False
        now = self.clock.now()
        if what in ("promote", "force"):
            if election.maintenance:
                return False  # service.py: "maintenance off first"
            if what == "force":
                self._forcing(election)
            election.promote(now, force=what == "force")
        elif what == "demote":
            election.demote(now)
        elif what == "handover":
            self._delivered = None  # the release it may cause is this command's, no frame's
            election.hand_over(now)
        else:
            election.set_maintenance(what == "maintenance on", now)
        self.world.checker.seen[f"operator: {what}"] += 1
        self.runner.poke()
        return True

    def _forcing(self, election: Election) -> None:
        """docs/ha.md: --force applies to one round, a new one started at once (its prepare
        must say so: acceptors may refuse this node as ineligible otherwise)."""
        self._force_next = True

    # -- what the node does --------------------------------------------------------

    def _send(self, address: str, message) -> None:
        if self._force_next and isinstance(message, Prepare):
            self.forced.add(message.req)
            self._force_next = False
        self.world.note(f"send {self.name}>{address} {message.TYPE} {message.req}")
        self.world.network.send(self.name, address, message)

    async def _persist(self, epoch: int) -> None:
        self.disk.epoch = epoch
        await self.gate("persist")

    async def _persist_ineligible(self, ineligible: frozenset[str]) -> None:
        self.disk.ineligible = ineligible
        if ineligible:
            self.world.checker.seen["ineligibility declared (kept by an acceptor)"] += 1
        await self.gate("persist")

    async def _confirm(self, digest: str) -> None:
        self.disk.confirmed = digest
        await self.gate("persist")

    def _event(self, event) -> None:
        checker = self.world.checker
        self.world.note(f"event {self.name} {event}")
        if isinstance(event, Acquired | Renewed):
            forced = self._round is not None and self._round.req in self.forced
            renewal = isinstance(event, Renewed)
            checker.granted(self, event.epoch, event.valid_until, renewal, forced)
            if not renewal and self.state is not None:
                checker.state.acquired(self, event.epoch, forced)
            self.fence.grant(event.valid_until, event.epoch)
            self._set_active(True)
        elif isinstance(event, Lost):
            self.fence.revoke()
            self._set_active(False)
            checker.lost(self)
            sender, message = self._delivered or ("", None)
            if event.reason == "handover" and isinstance(message, Handover):
                checker.handed_over(self, sender, message, event.epoch)
            elif event.reason == "handover":
                checker.seen["graceful hand-overs"] += 1

    def _set_active(self, active: bool) -> None:
        self.active = active
        if active:
            self._acting.set()
        elif self._acting.is_set():
            self._acting = trio.Event()

    def may_send(self) -> bool:
        """A plugin's question before an outward effect."""
        ok = self.fence.ok()
        self.world.checker.fence_checked(self, ok)
        return ok

    async def _outward_effects(self) -> None:
        """Answer 'clients' now and then, as DHCP would: ask the fence, then send, as a
        step of its own (a pause may land between the two)."""
        rng = random.Random(self.world.rng.random())
        sent = itertools.count()
        while True:
            await self._acting.wait()
            await trio.sleep(rng.uniform(0.02, 0.1))
            await self.gate()
            if not (self.active and self.may_send()):
                continue
            epoch = self.fence.epoch  # the fencing token the plugin sends with
            await self.gate("checked")
            ticket = self.world.checker.sent(self)
            effect = Effect(next(sent), epoch, ticket.tenure)
            self.world.network.send(self.name, RESOURCE, effect)


class World:
    def __init__(
        self,
        seed: int,
        *,
        appliances: int,
        witnesses: int,
        timing: Timing,
        rates: list[float],
        faults: Faults,
        replicated: bool = False,
    ) -> None:
        """``rates``: the clock rates, appliances' first; ``faults``: the network when healed;
        ``replicated``: appliances keep a replicated state log under a workload (replicas.py)."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.replicated = replicated
        self.timing = timing
        self.names = [f"a{i}" for i in range(appliances)]
        self.witnesses = [f"w{i}" for i in range(witnesses)]
        self.network = Network(self, faults)
        self.checker = Checker(self)
        if replicated:
            self.links = LinkNet(self, random.Random(self.rng.random()))
            self.clients = Clients(self, random.Random(self.rng.random()))
        self.processes = {
            name: Process(self, name, name in self.witnesses, rate, timing)
            for name, rate in zip((*self.names, *self.witnesses), rates, strict=True)
        }
        self.network.endpoints[RESOURCE] = Resource(self)
        self._digest = hashlib.sha256()
        self.trace: list[str] | None = None  # set to a list to keep the text too
        self.nursery: trio.Nursery | None = None  # where processes and pauses run
        self.schedule: trio.Nursery | None = None  # the faults' later steps, until healing
        self.seed_set = None  # what the scenario's faults draw on

    def peers_of(self, name: str) -> list[str]:
        return [n for n in self.names if n != name]

    def note(self, text: str) -> None:
        line = f"{trio.current_time():.9f} {text}\n".encode()
        self._digest.update(line)
        if self.trace is not None:
            self.trace.append(line.decode().rstrip())

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()

    def holders(self) -> list[str]:
        return [p.name for p in self.processes.values() if p.active and p.fence.ok()]

    async def settle(self) -> None:
        await trio.testing.wait_all_tasks_blocked()
