"""A whole rack in one ``trio.run``: appliances and witnesses running the real
election shell (:class:`ElectionRunner`, :class:`WitnessRunner`) over an
in-memory network, each with its own drifting clock, each a process that can
be killed, restarted and paused.

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
from dataclasses import dataclass, field

import trio
import trio.testing

from appliance.ha.election import AcceptorSet, Election
from appliance.ha.fence import Fence
from appliance.ha.messages import Accepted
from appliance.ha.proposer import Acquired, Lost, Renewed
from appliance.ha.runner import ElectionRunner, WitnessRunner
from appliance.ha.schema import Timing
from tests.simulation.checker import Checker

ADVERSARY = "adversary"  # the replaying box's address
MAX_RECORDED = 200


@dataclass
class DriftClock:
    """A node's monotonic clock: ``offset + rate * true time``."""

    rate: float
    offset: float

    def now(self) -> float:
        return self.offset + self.rate * trio.current_time()

    def to_trio(self, local: float) -> float:
        return (local - self.offset) / self.rate


@dataclass
class Faults:
    drop: float = 0.0
    duplicate: float = 0.0
    delay: tuple[float, float] = (0.0002, 0.002)
    cut: set[tuple[str, str]] = field(default_factory=set)  # (from, to): everything lost
    slow: dict[tuple[str, str], float] = field(default_factory=dict)  # (from, to): extra delay


class Network:
    """Datagrams between named endpoints, delivered in time order (reordered by random delays)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = world.rng
        self.faults = Faults()
        self.endpoints: dict[
            str, object
        ] = {}  # name -> runner (has .deliver) while its process lives
        self._heap: list = []
        self._seq = itertools.count()
        self._wake = trio.Event()
        self.sent = self.lost = 0
        self.recorded: list[tuple[str, object]] = []  # what the adversary captured
        self.replayed = 0

    def send(self, src: str, dst: str, message) -> None:
        self.sent += 1
        if isinstance(message, Accepted) and message.ok:
            self.world.checker.accepted(self.world.processes[src], message.promised_by, message.req)
        if len(self.recorded) < MAX_RECORDED and self.rng.random() < 0.2:
            self.recorded.append((src, message))
        faults = self.faults
        if (src, dst) in faults.cut or self.rng.random() < faults.drop:
            self.lost += 1
            return
        copies = 2 if self.rng.random() < faults.duplicate else 1
        for _ in range(copies):
            at = (
                trio.current_time()
                + self.rng.uniform(*faults.delay)
                + faults.slow.get((src, dst), 0.0)
            )
            heapq.heappush(self._heap, (at, next(self._seq), src, dst, message))
        self._wake.set()

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            while self._heap and self._heap[0][0] <= now:
                _, _, src, dst, message = heapq.heappop(self._heap)
                runner = self.endpoints.get(dst)
                if runner is None or (src, dst) in self.faults.cut:
                    continue  # nobody listens, or the cable was cut while it flew
                self.world.note(f"deliver {src}>{dst} {message.TYPE} {message.req}")
                runner.deliver(src, src, message)
            self._wake = trio.Event()
            with trio.move_on_at(self._heap[0][0] if self._heap else math.inf):
                await self._wake.wait()

    async def adversary(self) -> None:
        """A box on the network that replays captured frames, signatures intact, to any
        node; the answers go to its own address, where nobody listens."""
        while True:
            await trio.sleep(self.rng.uniform(0.05, 0.5))
            if not self.recorded:
                continue
            src, message = self.rng.choice(self.recorded)
            dst = self.rng.choice(sorted(self.world.processes))
            runner = self.endpoints.get(dst)
            if runner is not None and dst != src:
                self.replayed += 1
                self.world.note(f"replay {src}>{dst} {message.TYPE} {message.req}")
                runner.deliver(src, ADVERSARY, message)


class Process:
    """One appliance or witness: killed, restarted, paused; its disk survives (appliances)."""

    def __init__(self, world: World, name: str, witness: bool, rate: float) -> None:
        self.world = world
        self.name = name
        self.witness = witness
        self.clock = DriftClock(rate, world.rng.uniform(0, 1000))
        self.disk_epoch = 0  # appliances persist the highest accepted epoch
        self.disk_confirmed = ""  # and the membership every peer was seen to share
        self.listed_witnesses: list[str] | None = None  # its [ha] witnesses, if not the world's
        self.fence = Fence(self.clock.now)
        self.active = False  # the role the shell gives the node
        self.scope: trio.CancelScope | None = None
        self.runner: ElectionRunner | WitnessRunner | None = None
        self.paused_at: float | None = None
        self._resumed = trio.Event()
        self.incarnation = 0
        self.effects = 0

    @property
    def alive(self) -> bool:
        return self.scope is not None

    async def gate(self) -> None:
        while self.paused_at is not None:
            await self._resumed.wait()

    # -- life -----------------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        self.incarnation += 1
        self.world.note(f"start {self.name} #{self.incarnation}")
        nursery.start_soon(self._life)

    async def _life(self) -> None:
        world = self.world
        with trio.CancelScope() as scope:
            self.scope = scope
            now = self.clock.now()

            def send(address, message):
                world.note(f"send {self.name}>{address} {message.TYPE} {message.req}")
                world.network.send(self.name, address, message)

            if self.witness:
                self.runner = WitnessRunner(
                    AcceptorSet(world.timing.lease, now), send, clock=self.clock, resume=self.gate
                )
            else:
                election = Election(
                    self.name, "rack", world.timing, peers=world.peers_of(self.name),
                    witnesses=self.listed_witnesses or world.witnesses, now=now,
                    known_epoch=self.disk_epoch,
                    confirmed=self.disk_confirmed,
                    incarnation=self.incarnation, rng=random.Random(world.rng.random()),
                )  # fmt: skip
                self.runner = ElectionRunner(
                    election, send, clock=self.clock, on_event=self._event,
                    persist=self._persist, resume=self.gate, confirm=self._confirm,
                )  # fmt: skip
            world.network.endpoints[self.name] = self.runner
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.runner.run)
                if not self.witness:
                    nursery.start_soon(self._outward_effects)
        if self.scope is scope:
            self.scope = None

    def kill(self) -> None:
        self.world.note(f"kill {self.name}")
        self.world.network.endpoints.pop(self.name, None)
        if self.scope is not None:
            self.scope.cancel()
            self.scope = None
        self.active = False
        self.fence.revoke()
        self.paused_at = None
        self._resumed.set()

    def pause(self) -> None:
        self.world.note(f"pause {self.name}")
        self.paused_at = trio.current_time()
        self._resumed = trio.Event()

    def resume(self, nursery: trio.Nursery) -> None:
        self.world.note(f"resume {self.name}")
        self.paused_at = None
        self._resumed.set()
        if not self.witness and self.alive:
            nursery.start_soon(self.world.checker.stepped_down_after_pause, self)

    # -- what the node does --------------------------------------------------------

    async def _persist(self, epoch: int) -> None:
        self.disk_epoch = epoch

    async def _confirm(self, digest: str) -> None:
        self.disk_confirmed = digest

    def _event(self, event) -> None:
        world = self.world
        world.note(f"event {self.name} {event}")
        if isinstance(event, Acquired | Renewed):
            world.checker.granted(self, event.epoch, event.valid_until, isinstance(event, Renewed))
            self.fence.grant(event.valid_until, event.epoch)
            self.active = True
        elif isinstance(event, Lost):
            self.fence.revoke()
            self.active = False
            world.checker.lost(self)

    async def _outward_effects(self) -> None:
        """Answer 'clients' now and then, through the fence, as DHCP would."""
        rng = random.Random(self.world.rng.random())
        while True:
            await trio.sleep(rng.uniform(0.02, 0.1))
            await self.gate()
            if self.active and self.fence.ok():
                self.effects += 1
                self.world.checker.effect(self)


class World:
    def __init__(
        self,
        seed: int,
        *,
        appliances: int,
        witnesses: int,
        timing: Timing,
        drift: float,
        extreme_rates: bool = False,
    ) -> None:
        """``extreme_rates``: every clock runs at a bound of the allowed error (1 - drift
        or 1 + drift), not anywhere within it: the adversarial timing set."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.timing = timing
        self.names = [f"a{i}" for i in range(appliances)]
        self.witnesses = [f"w{i}" for i in range(witnesses)]
        self.network = Network(self)
        self.checker = Checker(self)
        self.processes = {
            name: Process(
                self,
                name,
                name in self.witnesses,
                self.rng.choice([1 - drift, 1 + drift])
                if extreme_rates
                else self.rng.uniform(1 - drift, 1 + drift),
            )
            for name in (*self.names, *self.witnesses)
        }
        self._digest = hashlib.sha256()
        self.trace: list[str] | None = None  # set to a list to keep the text too
        self.reconfigure = False  # appliances' witnesses change between restarts

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
