"""One seeded run: a rack, a random schedule of faults, the invariants, a healed ending.

:func:`run_seed` builds the rack the seed picks (2-3 appliances, 0-2
witnesses, clock rates as its seed set says), then every 0.1-2 s of virtual
time applies a fault: kill or restart a process, restart an appliance with
another lease, pause one (often past its lease) or stop it at its next step
(between a fence check and the send, between persisting an epoch and
answering), partition two nodes, cut one direction of a link, change loss,
duplication and delay, an operator's promote, promote --force, demote or
maintenance, the witness-amnesia scenario of docs/ha.md, or heal. For the
last ``HEAL`` seconds every fault is lifted and every process restarted, and
the run must end with exactly one holder: a rack that never elects anyone
breaks no safety rule, so liveness is checked too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from dataclasses import dataclass, field

import trio
import trio._core._run as trio_run
import trio.testing

from appliance.ha.schema import MIN_MARGIN, Timing, check_timing
from tests.simulation.checker import COVER
from tests.simulation.world import Faults, Process, Trap, World

HEAL = 5.0
DURATION = 16.0
DRIFT = 0.05  # clocks drift up to 5 %: far beyond real ones, so the margin is what holds


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
    """What one CI seed set fixes: timings, clock rates, the network's own delay, the
    schedule. Every set runs ``RACKBOOT_SIM_SEEDS`` seeds."""

    name: str
    doc: str
    timings: tuple[Timing, Timing]  # appliances start on the first; witnesses keep it
    rates: str = "uniform"  # within the error; "bounds": each at one; "slow-holder"
    late: tuple[float, float] = (0.0, 0.0)  # until healing, answers to the holder come late
    reconfigure: bool = False  # the membership schedule
    weights: dict[str, int] = field(default_factory=dict)  # over DEFAULT_WEIGHTS
    # Pauses between the runner's sends and its events (step "sent"): kept out of the CI sets
    # while runner.py sends a release before it revokes the fence (test_election_sim.py).
    after_send: bool = False
    ci: bool = True

    @property
    def timing(self) -> Timing:
        return self.timings[0]


DEFAULT_WEIGHTS = {
    "kill": 3, "restart": 3, "pause": 3, "trap": 5, "partition": 3, "one-way": 2, "loss": 2,
    "duplicate": 1, "delay": 2, "slow-link": 2, "heal": 2, "lease": 3, "promote": 2,
    "force": 1, "demote": 1, "maintenance": 1, "amnesia": 2, "lower-lease": 3, "reconfigure": 0,
}  # fmt: skip
BOUND = timings(1.0, 0.25)
ROUND = BOUND[0].round_timeout

SETS = {
    s.name: s
    for s in (
        SeedSet("default", "the default timings (margin 0.15 s), clocks anywhere within 5 %",
                timings(1.0, 0.25, 0.15)),
        SeedSet("margin-bound", "the margin at its legal minimum, every clock at a bound of "
                "the rate error", BOUND, rates="bounds"),
        SeedSet("slow-holder", "the margin at its legal minimum, a0's clock the slowest "
                "allowed, every other node's the fastest", BOUND, rates="slow-holder"),
        SeedSet("late-answers", "the margin at its legal minimum, a0's clock the slowest, and "
                "every answer to the holder late, so its rounds end near their timeout",
                BOUND, rates="slow-holder", late=(0.3 * ROUND, 0.5 * ROUND)),
        SeedSet("membership", "appliances whose witness is swapped one appliance at a time "
                "(half the racks misconfigured from the start), partitions, hand-overs",
                timings(1.0, 0.25, 0.15), reconfigure=True,
                weights={"partition": 8, "reconfigure": 4, "promote": 4, "lease": 0,
                         "amnesia": 0, "lower-lease": 0}),
        SeedSet("pause-after-send", "the default set, more demotes and maintenance, each "
                "stopping the holder right after its release left (before its events)",
                timings(1.0, 0.25, 0.15), after_send=True, ci=False,
                weights={"demote": 6, "maintenance": 6}),
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
    if isinstance(seed_set, str):
        seed_set = SETS[seed_set]
    with deterministic_scheduler(seed):
        return trio.run(
            _run,
            seed,
            seed_set,
            duration,
            trace,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )


def _rates(seed_set: SeedSet, rng: random.Random, count: int) -> list[float]:
    drift = seed_set.timing.max_clock_rate_error
    if seed_set.rates == "slow-holder":
        return [1 - drift] + [1 + drift] * (count - 1)
    if seed_set.rates == "bounds":
        return [rng.choice([1 - drift, 1 + drift]) for _ in range(count)]
    return [rng.uniform(1 - drift, 1 + drift) for _ in range(count)]


def _world(seed: int, seed_set: SeedSet) -> World:
    pick = random.Random(seed ^ 0x5EED)
    layouts = [(2, 2)] if seed_set.reconfigure else [(2, 1), (2, 1), (3, 0), (2, 2), (3, 1), (3, 2)]
    appliances, witnesses = pick.choice(layouts)
    world = World(
        seed, appliances=appliances, witnesses=witnesses, timing=seed_set.timing,
        rates=_rates(seed_set, pick, appliances + witnesses), faults=Faults(late=seed_set.late),
    )  # fmt: skip
    world.seed_set = seed_set
    if seed_set.reconfigure:  # half the racks start misconfigured: the last appliance lists w1
        for name in world.names:
            world.processes[name].listed_witnesses = world.witnesses[:1]
        if pick.random() < 0.5:
            world.processes[world.names[-1]].listed_witnesses = world.witnesses[1:2]
    return world


async def _run(seed: int, seed_set: SeedSet, duration: float, keep_trace: bool) -> Result:
    world = _world(seed, seed_set)
    if keep_trace:
        world.trace = []
    weights = {**DEFAULT_WEIGHTS, **seed_set.weights}
    kinds, odds = list(weights), list(weights.values())
    async with trio.open_nursery() as nursery:
        world.nursery = nursery
        nursery.start_soon(world.network.run)
        nursery.start_soon(world.network.adversary)
        for process in world.processes.values():
            process.start()
        async with trio.open_nursery() as schedule:  # faults' later steps end with it
            world.schedule = schedule
            rng = world.rng
            while trio.current_time() < duration - HEAL:
                await trio.sleep(rng.uniform(0.1, 2.0))
                kind = rng.choices(kinds, odds)[0]
                world.checker.seen["faults"] += 1
                target = _target(world, rng)
                world.note(f"fault {kind} {target.name}")
                script = FAULTS[kind](world, rng, target)
                if script is not None:  # a scenario of several steps: no other fault meanwhile
                    await script
            schedule.cancel_scope.cancel()
        _heal(world)
        await trio.sleep(HEAL)
        holders = world.holders()
        if len(holders) != 1:
            world.checker.fail(f"no single holder {HEAL} s after healing: {holders}")
        nursery.cancel_scope.cancel()
    checker = world.checker
    checker.seen["messages"] = world.network.sent
    layout = f"{len(world.names)} appliances + {len(world.witnesses)} witnesses"
    return Result(
        seed, seed_set.name, world.digest, checker.violations, layout, dict(checker.seen),
        world.trace,
    )  # fmt: skip


def _target(world: World, rng) -> Process:
    holders = world.holders()
    if holders and rng.random() < 0.5:  # the holder's failures are the interesting ones
        return world.processes[holders[0]]
    return world.processes[rng.choice(list(world.processes))]


# -- faults: each (world, rng, the process it picked) ---------------------------------


def _appliance(world: World, rng) -> Process:
    return world.processes[rng.choice(world.names)]


def _standby(world: World, rng) -> Process:
    holders = world.holders()
    return world.processes[rng.choice([n for n in world.names if n not in holders] or world.names)]


def _last_one(world: World, rng) -> Process | None:
    """docs/ha.md: promote --force only when the other appliances are known to be down."""
    alive = [n for n in world.names if world.processes[n].alive]
    return world.processes[alive[0]] if len(alive) == 1 else None


def _restart(world: World, process: Process, after: float) -> None:
    if process.alive:
        process.kill()

    async def later():
        await trio.sleep(after)
        if not process.alive:
            process.start()

    world.schedule.start_soon(later)


def kill(world, rng, process):
    if process.alive:
        process.kill()


def restart(world, rng, process):
    _restart(world, process, rng.uniform(0.0, 1.5))


def lease(world, rng, process):
    """An operator changes an appliance's [ha] lease (timings within the rules) and restarts
    it: lowering it must not shorten the restart wait (the longest lease is on disk)."""
    process = _appliance(world, rng)
    long, short = world.seed_set.timings
    process.timing = short if process.timing == long else long
    world.checker.seen["restarts with another lease"] += 1
    _restart(world, process, rng.uniform(0.0, 0.3))


def lower_lease(world, rng, process):
    """A lease lowered on the one appliance that still shares the holder's grant: the
    holder is cut off from every other node (their grants run out), then, as it renews,
    from that appliance too, which the operator restarts with the shorter lease. Its
    restart wait must still cover the holder's longer grant, or it elects a second holder
    with the nodes the holder lost first."""
    holders, short = world.holders(), world.seed_set.timings[1]
    others = [n for n in world.names if n not in holders and world.processes[n].alive]
    if not holders or not others:
        return
    world.checker.seen["lease lowered beside a holder cut off from the rest"] += 1
    return _lower_lease(world, rng, holders[0], rng.choice(others), short)


async def _lower_lease(world: World, rng, holder: str, sharing: str, short: Timing) -> None:
    _cut_off(world, holder, keep=sharing)
    await trio.sleep(rng.uniform(1.0, 1.5))  # the holder's grants elsewhere run out
    await _just_renewed(world.processes[holder])  # its grant at `sharing` is at its longest
    links = _cut_off(world, holder)
    process = world.processes[sharing]
    process.timing = short
    _restart(world, process, rng.uniform(0.0, 0.05))
    await trio.sleep(2.0)
    world.network.faults.cut -= links


def pause(world, rng, process):
    if process.alive and process.paused_at is None:
        process.pause(rng.uniform(0.05, 3.0))  # often past the lease: the interesting case


def trap(world, rng, process):
    """Stop the process at its next step of one kind. Between a fence check and its send:
    for no longer than the margin covers, a little longer, or past a failover (then the
    successor's effects may reach the resource first)."""
    steps = ["woke"] if process.witness else ["woke", "persist", "checked", "checked"]
    if world.seed_set.after_send and not process.witness:
        steps.append("sent")
    step = rng.choice(steps)
    if step == "checked":
        seconds = rng.uniform(*rng.choice([(0, COVER), (COVER, 0.5), (0.5, 3.0)]))
    else:
        seconds = rng.uniform(0.01, 3.0)
    process.trap = Trap(step, seconds)


def partition(world, rng, process, both_ways=True):
    other = rng.choice([n for n in world.processes if n != process.name])
    world.network.faults.cut.add((process.name, other))
    if both_ways:
        world.network.faults.cut.add((other, process.name))


def one_way(world, rng, process):
    partition(world, rng, process, both_ways=False)


def loss(world, rng, process):
    world.network.faults.drop = rng.choice([0.0, 0.05, 0.2, 0.5])


def duplicate(world, rng, process):
    world.network.faults.duplicate = rng.choice([0.0, 0.1, 0.3])


def delay(world, rng, process):
    high = rng.choice([0.002, 0.02, 0.1, 0.3])
    world.network.faults.delay = (high / 10, high)


def slow_link(world, rng, process):
    """Everything arriving at the holder (or one node) late, so its rounds end near their
    timeout (a congested queue): answers that come back late are what validity counted
    from the grant, rather than from the round's start, gets wrong."""
    holders = world.holders()
    process = world.processes[holders[0]] if holders else process
    slow = rng.uniform(0.3, 0.5) * world.timing.round_timeout  # two such hops: the round fits
    for other in world.processes:
        if other != process.name:
            world.network.faults.slow[(other, process.name)] = slow


def heal(world, rng, process):
    world.network.faults.cut.clear()
    world.network.faults.slow.clear()


def operator(what: str, pick=_appliance):
    def command(world, rng, process):
        process = pick(world, rng)
        if process is None or not process.command(what):
            return
        if what in ("demote", "maintenance on") and world.seed_set.after_send:
            # stopped right after the release leaves (the runner sends, then applies events)
            process.trap = Trap("sent", rng.uniform(0.001, 0.3))
        if what == "maintenance on":  # the update takes a while, then maintenance off
            world.schedule.start_soon(_later, rng.uniform(0.2, 3.0), process.command, "off")

    return command


async def _later(seconds: float, fn, *args) -> None:
    await trio.sleep(seconds)
    fn(*args)


def amnesia(world, rng, process):
    """docs/ha.md, "The witness and epochs", as a script: the holder is cut off and another
    appliance takes over with a new epoch; every witness restarts (amnesic) and the new
    holder dies; an operator who knows it is down forces the cut-off one, whose forced
    round fails (it is still cut off); the cut heals. The old holder must not take over on
    its own later with an epoch the dead holder had: only a remembering majority (or an
    operator, knowingly, for that one round) may pick an epoch."""
    holders = world.holders()
    if not world.witnesses or not holders:
        return
    world.checker.seen["amnesia scenarios"] += 1
    return _amnesia(world, rng, world.processes[holders[0]])


def _cut_off(world: World, name: str, keep: str = "") -> set[tuple[str, str]]:
    """A scenario starts on a healed network, ``name`` cut off from all but ``keep``."""
    links = {(name, n) for n in world.processes if n != keep}
    links |= {(n, name) for n, _ in links}
    world.network.faults = Faults(cut=set(links))
    return links


async def _amnesia(world: World, rng, isolated: Process) -> None:
    links = _cut_off(world, isolated.name)
    successor = await _new_holder(world, isolated.name, within=3.0)
    if successor is not None:
        for name in world.witnesses:
            _restart(world, world.processes[name], 0.0)
        await trio.sleep(rng.uniform(0.0, 0.3))
        for name in world.names:
            if name != isolated.name and world.processes[name].alive:
                world.processes[name].kill()
        world.checker.seen["amnesia scenarios: holder killed after witnesses restarted"] += 1
        await trio.sleep(rng.uniform(0.0, 0.5))
        isolated.command("force")
        await trio.sleep(rng.uniform(0.3, 0.6))  # the forced round times out
    world.network.faults.cut -= links


async def _just_renewed(process: Process, within: float = 0.5) -> None:
    for _ in range(int(within / 0.01)):
        valid_until = getattr(process.election, "valid_until", None)
        if valid_until is None or valid_until - process.clock.now() > process.timing.usable - 0.02:
            return
        await trio.sleep(0.01)


async def _new_holder(world: World, old: str, within: float) -> Process | None:
    for _ in range(int(within / 0.05)):
        await trio.sleep(0.05)
        holders = [name for name in world.holders() if name != old]
        if holders:
            return world.processes[holders[0]]
    return None


def reconfigure(world, rng, process):
    """The operator swaps the witness one appliance lists, and restarts it."""
    appliance = _appliance(world, rng)
    listed = appliance.listed_witnesses or world.witnesses
    appliance.listed_witnesses = [w for w in world.witnesses if w not in listed][:1] or listed
    world.checker.seen["membership changes"] += 1
    _restart(world, appliance, rng.uniform(0.0, 1.5))


FAULTS = {
    "kill": kill, "restart": restart, "pause": pause, "trap": trap, "partition": partition,
    "one-way": one_way, "loss": loss, "duplicate": duplicate, "delay": delay,
    "slow-link": slow_link, "heal": heal, "lease": lease, "promote": operator("promote", _standby),
    "force": operator("force", _last_one), "demote": operator("demote"),
    "maintenance": operator("maintenance on"), "amnesia": amnesia, "lower-lease": lower_lease,
    "reconfigure": reconfigure,
}  # fmt: skip


def _heal(world: World) -> None:
    world.network.faults = Faults()  # a LAN: liveness is promised on a healthy network
    # Rollouts are finished: every appliance has a0's [ha] witnesses and timings (while
    # appliances' leases differ a rack may have no holder: see test_election_sim.py).
    first = world.processes[world.names[0]]
    for name in world.names[1:]:
        process = world.processes[name]
        if (process.listed_witnesses, process.timing) != (first.listed_witnesses, first.timing):
            process.listed_witnesses, process.timing = first.listed_witnesses, first.timing
            process.kill()
    for process in world.processes.values():
        process.trap = None
        if process.paused_at is not None:
            process.resume()
        if not process.alive:
            process.start()
        elif process.election is not None and process.election.maintenance:
            process.command("off")
    world.note("healed")


def summary(results: list[Result]) -> str:
    failed = [r for r in results if not r.ok]
    total = len(results)
    seen: dict[str, int] = {}
    for r in results:
        for key, count in r.seen.items():
            seen[key] = seen.get(key, 0) + count
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
