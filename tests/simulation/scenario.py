"""One seeded run: a rack, a random schedule of faults, the invariants, a healed ending.

:func:`run_seed` builds the rack the seed picks (2-3 appliances, 0-2
witnesses, clock rates as its seed set says), then every 0.1-2 s of virtual
time applies a fault (faults.py): kill or restart a process, restart an
appliance with another lease, pause one (often past its lease) or stop it at
its next step (between a fence check and the send, between persisting an
epoch and answering), partition two nodes, cut one direction of a link,
change loss, duplication and delay, slow the answers to the holder, an
operator's promote, promote --force, demote or maintenance, a scripted
scenario (the witness-amnesia double failure, a lease lowered beside a holder
cut off from the rest), a membership change, or heal. For the last ``HEAL``
seconds every fault is lifted, every rollout finished and every process
restarted, and the run must end with exactly one holder: a rack that never
elects anyone breaks no safety rule, so liveness is checked too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
from dataclasses import dataclass, field

import trio
import trio._core._run as trio_run
import trio.testing

from appliance.ha.schema import MIN_MARGIN, Timing, check_timing
from tests.simulation import replicas
from tests.simulation.faults import FAULTS, heal_all, target
from tests.simulation.world import Faults, World

HEAL = 5.0
DURATION = 16.0
DRIFT = 0.05  # clocks drift up to 5 %: far beyond real ones, so the margin is what holds
LAYOUTS = ((2, 1), (2, 1), (3, 0), (2, 2), (3, 1), (3, 2))  # (appliances, witnesses)


def margin_bound(lease: float, drift: float = DRIFT) -> float:
    """The smallest margin appliance/ha/schema.py check_timing allows."""
    return 2 * drift * lease + MIN_MARGIN


def timings(lease: float, renew: float, margin: float | None = None) -> tuple[Timing, Timing]:
    """The set's timings and the shorter lease an operator may switch an appliance to
    (``margin`` None: each at its legal minimum); both pass check_timing."""

    def timing(lease: float, margin: float | None) -> Timing:
        margin = margin_bound(lease) if margin is None else margin
        return check_timing(Timing(lease, min(renew, (lease - margin) / 2), margin, DRIFT))

    return timing(lease, margin), timing(0.5 * lease, margin and 0.5 * margin)


@dataclass(frozen=True)
class SeedSet:
    """What one seed set fixes: timings, clock rates, the network, the schedule. Every CI
    set runs ``RACKBOOT_SIM_SEEDS`` seeds."""

    name: str
    doc: str
    timings: tuple[Timing, Timing]  # appliances start on the first; witnesses keep it
    rates: str = "uniform"  # within the error; "bounds": each at one; "slow-holder"
    late: tuple[float, float] = (0.0, 0.0)  # until healing, answers to the holder come late
    layouts: tuple[tuple[int, int], ...] = LAYOUTS
    reconfigure: bool = False  # racks start on two memberships half the time
    short: tuple[str, ...] = ()  # appliances that start on the shorter lease
    weights: dict[str, int] = field(default_factory=dict)  # over DEFAULT_WEIGHTS
    # Pauses between the runner's sends and its events (step "sent"): kept out of the CI sets
    # while runner.py sends a release before it revokes the fence (test_election_sim.py).
    after_send: bool = False
    finish_rollouts: bool = True  # at healing: one membership, one lease
    replay_answers: bool = False  # the adversary replays answers to rounds with their id
    # A replicated state log per appliance under a perfdhcp-like load (replicas.py), and
    # the healed time at the end: load, then quiet.
    replicated: bool = False
    heal: float = HEAL
    ci: bool = True

    @property
    def timing(self) -> Timing:
        return self.timings[0]


DEFAULT_WEIGHTS = {
    "kill": 3, "restart": 3, "pause": 3, "trap": 5, "partition": 3, "one-way": 2, "loss": 2,
    "duplicate": 1, "delay": 2, "slow-link": 2, "heal": 2, "lease": 3, "promote": 2,
    "force": 1, "demote": 1, "maintenance": 1, "amnesia": 2, "lower-lease": 3, "reconfigure": 0,
    "handover": 0,
    "power": 0, "crash-mid-fsync": 0, "slow-disk": 0, "clock-step": 0, "isolate-standby": 0,
}  # fmt: skip
# The replicated sets: the disk and the state log's own failures, fewer lease changes.
REPLICATION_WEIGHTS = {
    "power": 2, "crash-mid-fsync": 4, "slow-disk": 2, "clock-step": 1, "isolate-standby": 3,
    "lease": 1, "lower-lease": 1, "amnesia": 1,
}  # fmt: skip
QUIET_END = 3.0  # s at the end of a replicated run with no new request: the logs converge
# Task steps at one instant of the mock clock beyond which a run is a livelock: a task
# that wakes itself without waiting (a timer armed in the past) stops the clock, and the
# seed would spin for ever instead of failing. Seeds take at most ~50 steps an instant.
LIVELOCK_STEPS = 100_000
QUIET = {kind: 0 for kind in DEFAULT_WEIGHTS} | {"heal": 1}  # nothing but the start state
DEFAULT = timings(1.0, 0.25, 0.15)
BOUND = timings(1.0, 0.25)
ROUND = BOUND[0].round_timeout

SETS = {
    s.name: s
    for s in (
        SeedSet("default", "the default timings (margin 0.15 s), clocks anywhere within 5 %",
                DEFAULT),
        SeedSet("margin-bound", "the margin at its legal minimum, every clock at a bound of "
                "the rate error", BOUND, rates="bounds"),
        SeedSet("slow-holder", "the margin at its legal minimum, a0's clock the slowest "
                "allowed, every other node's the fastest", BOUND, rates="slow-holder"),
        SeedSet("late-answers", "the margin at its legal minimum, a0's clock the slowest, and "
                "every answer to the holder late, so its rounds end near their timeout",
                BOUND, rates="slow-holder", late=(0.3 * ROUND, 0.5 * ROUND)),
        SeedSet("membership", "appliances whose witness is swapped one appliance at a time "
                "(half the racks misconfigured from the start), partitions, hand-overs",
                DEFAULT, layouts=((2, 2),), reconfigure=True,
                weights={"partition": 8, "reconfigure": 4, "promote": 4, "lease": 0,
                         "amnesia": 0, "lower-lease": 0}),
        SeedSet("handover", "the default set with graceful hand-overs (`rackboot ha "
                "handover`) on the holder or a standby at random moments, among kills, pauses "
                "and partitions", DEFAULT, weights={"handover": 8, "lease": 1, "lower-lease": 1}),
        # Not in CI: each shows a bug reported, not fixed yet (test_election_sim.py).
        SeedSet("pause-after-send", "the default set, more demotes and maintenance, each "
                "stopping the holder right after its release left (before its events)",
                DEFAULT, after_send=True, weights={"demote": 6, "maintenance": 6}, ci=False),
        SeedSet("replayed-answers", "the default set, the adversary also replaying the "
                "answers to one proposer's round to another asking with the same request id",
                DEFAULT, replay_answers=True, ci=False),
        SeedSet("mixed-leases", "three appliances and a witness, a0 and a1 on the shorter "
                "lease, a2 on the longer, no fault", DEFAULT, layouts=((3, 1),),
                short=("a0", "a1"), weights=QUIET, finish_rollouts=False, ci=False),
        SeedSet("replication", "the default set with a replicated state log on every "
                "appliance under a perfdhcp-like load; power cuts, kills and pauses during "
                "fsyncs, slow disks, wall-clock steps, standbys cut off from the holder",
                DEFAULT, replicated=True, heal=7.0,
                weights=REPLICATION_WEIGHTS),
    )
}  # fmt: skip
CI_SETS = [name for name, s in SETS.items() if s.ci]


@dataclass
class Result:
    seed: int
    set: str
    digest: str
    violations: list[str]
    layout: str
    seen: dict[str, int]  # what the run exercised (the checker's counters)
    trace: list[str] | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return not self.violations


@contextlib.contextmanager
def deterministic_scheduler(seed: int):
    """trio shuffles runnable tasks from a module-level Random: seed it, and sort first."""
    saved_flag, saved_state = trio_run._ALLOW_DETERMINISTIC_SCHEDULING, trio_run._r.getstate()
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True
    trio_run._r.seed(seed)
    try:
        yield
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved_flag
        trio_run._r.setstate(saved_state)


def run_seed(
    seed: int, seed_set: SeedSet | str = "default", *, duration: float = DURATION, trace=False
) -> Result:
    seed_set = SETS[seed_set] if isinstance(seed_set, str) else seed_set
    clock = trio.testing.MockClock(autojump_threshold=0)
    with deterministic_scheduler(seed), contextlib.ExitStack() as stack:
        if seed_set.replicated:
            stack.enter_context(replicas.patched())
            stack.enter_context(_quiet_logs())
        return trio.run(_run, seed, seed_set, duration, trace, clock=clock)


@contextlib.contextmanager
def _quiet_logs():
    """The state shell logs every link it drops and every cut: not here."""
    logger = logging.getLogger("rackboot")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _rates(seed_set: SeedSet, rng: random.Random, count: int) -> list[float]:
    drift = seed_set.timing.max_clock_rate_error
    if seed_set.rates == "slow-holder":
        return [1 - drift] + [1 + drift] * (count - 1)
    if seed_set.rates == "bounds":
        return [rng.choice([1 - drift, 1 + drift]) for _ in range(count)]
    return [rng.uniform(1 - drift, 1 + drift) for _ in range(count)]


def _world(seed: int, seed_set: SeedSet) -> World:
    pick = random.Random(seed ^ 0x5EED)
    appliances, witnesses = pick.choice(seed_set.layouts)
    world = World(
        seed, appliances=appliances, witnesses=witnesses, timing=seed_set.timing,
        rates=_rates(seed_set, pick, appliances + witnesses), faults=Faults(late=seed_set.late),
        replicated=seed_set.replicated,
    )  # fmt: skip
    world.seed_set = seed_set
    world.network.targeted = seed_set.replay_answers
    for name in seed_set.short:
        world.processes[name].timing = seed_set.timings[1]
    if seed_set.reconfigure:  # half the racks start misconfigured: the last appliance lists w1
        for name in world.names:
            world.processes[name].listed_witnesses = world.witnesses[:1]
        if pick.random() < 0.5:
            world.processes[world.names[-1]].listed_witnesses = world.witnesses[1:2]
    return world


LAST: list[World] = []  # the world of the last run in this process (to debug one seed)


class _Livelock(trio.abc.Instrument):
    """Ends the run as a violation when the mock clock stops while tasks keep running."""

    def __init__(self, world: World, scope: trio.CancelScope) -> None:
        self.world, self.scope = world, scope
        self.at, self.steps = -1.0, 0

    def before_task_step(self, task) -> None:
        now = trio.current_time()
        if now != self.at:
            self.at, self.steps = now, 0
            return
        self.steps += 1
        if self.steps == LIVELOCK_STEPS:
            self.world.checker.fail(f"livelock: {self.steps} task steps without the clock moving")
            self.scope.cancel()


async def _run(seed: int, seed_set: SeedSet, duration: float, keep_trace: bool) -> Result:
    world = _world(seed, seed_set)
    LAST[:] = [world]
    world.trace = [] if keep_trace else None
    async with trio.open_nursery() as nursery:
        trio.lowlevel.add_instrument(_Livelock(world, nursery.cancel_scope))
        world.nursery = nursery
        nursery.start_soon(world.network.run)
        nursery.start_soon(world.network.adversary)
        if world.replicated:
            nursery.start_soon(world.links.run)
            nursery.start_soon(world.clients.run)
            nursery.start_soon(world.clients.deliver)
        for process in world.processes.values():
            process.start()
        async with trio.open_nursery() as schedule:  # faults' later steps end with it
            world.schedule = schedule
            await _faults(world, duration - seed_set.heal)
            schedule.cancel_scope.cancel()
        heal_all(world)
        if world.replicated:
            await trio.sleep(seed_set.heal - QUIET_END)
            world.clients.running = False
            await trio.sleep(QUIET_END)
        else:
            await trio.sleep(seed_set.heal)
        holders = world.holders()
        if len(holders) != 1:
            world.checker.fail(f"no single holder {seed_set.heal} s after healing: {holders}")
        elif world.replicated:
            world.checker.state.converged()
        nursery.cancel_scope.cancel()
    checker = world.checker
    checker.seen["messages"] = world.network.sent
    layout = f"{len(world.names)} appliances + {len(world.witnesses)} witnesses"
    return Result(
        seed, seed_set.name, world.digest, checker.violations, layout, dict(checker.seen),
        world.trace,
    )  # fmt: skip


async def _faults(world: World, until: float) -> None:
    weights = {**DEFAULT_WEIGHTS, **world.seed_set.weights}
    kinds, odds, rng = list(weights), list(weights.values()), world.rng
    while trio.current_time() < until:
        await trio.sleep(rng.uniform(0.1, 2.0))
        kind = rng.choices(kinds, odds)[0]
        world.checker.seen["faults"] += 1
        process = target(world, rng)
        world.note(f"fault {kind} {process.name}")
        script = FAULTS[kind](world, rng, process)
        if script is not None:  # a scenario of several steps: no other fault meanwhile
            await script


def totals(results: list[Result]) -> dict[str, int]:
    seen: dict[str, int] = {}
    for result in results:
        for key, count in result.seen.items():
            seen[key] = seen.get(key, 0) + count
    return seen


def summary(results: list[Result]) -> str:
    failed = [r for r in results if not r.ok]
    total = len(results)
    seen = totals(results)
    lines = [f"{total} seeds: {total - len(failed)} passed, {len(failed)} failed"]
    lines += [f"  {key}: {seen[key]}" for key in sorted(seen)]
    for r in failed:
        lines.append(f"  seed {r.seed} ({r.set}, {r.layout}): {r.violations[0]}")
    if failed:
        sets = {r.set for r in failed}
        lines.append("  failing seeds: " + " ".join(str(r.seed) for r in failed))
        lines.append(
            f"  replay one: python -m tests.simulation --set {min(sets)} --seed SEED --trace"
        )
    return "\n".join(lines)


def with_margin(seed_set: SeedSet, margin: float) -> SeedSet:
    """The set with every timing's margin replaced (a mutation: no rule checks it)."""
    return dataclasses.replace(
        seed_set, timings=tuple(dataclasses.replace(t, margin=margin) for t in seed_set.timings)
    )
