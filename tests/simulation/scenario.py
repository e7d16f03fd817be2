"""One seeded run: a rack, a random schedule of faults, the invariants, a healed ending.

:func:`run_seed` builds the rack the seed picks (2-3 appliances, 1-2
witnesses, clock rates within ``max_clock_rate_error``), then every 0.1-2 s
of virtual time applies a fault: kill or restart a process, pause one (often
past its lease), partition two nodes, cut one direction of a link, change
loss, duplication and delay, or heal. For the last ``HEAL`` seconds every
fault is lifted and every process restarted, and the run must end with
exactly one holder: a rack that never elects anyone breaks no safety rule,
so liveness is checked too.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field

import trio
import trio._core._run as trio_run
import trio.testing

from appliance.ha.schema import MIN_MARGIN, Timing
from tests.simulation.world import Faults, World

HEAL = 5.0
SIM_TIMING = Timing(lease=1.0, renew=0.25, margin=0.15, max_clock_rate_error=0.05)
# The margin at its legal minimum for that drift (appliance/ha/schema.py check_timing).
MARGIN_BOUND = Timing(lease=1.0, renew=0.25, margin=2 * 0.05 * 1.0 + MIN_MARGIN,
                      max_clock_rate_error=0.05)  # fmt: skip


@dataclass
class Result:
    seed: int
    digest: str
    violations: list[str]
    layout: str
    acquisitions: int
    grants: int
    effects: int
    failovers: int
    stale_resumes: int
    faults: int
    messages: int
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
    seed: int,
    *,
    duration: float = 16.0,
    timing: Timing = SIM_TIMING,
    trace=False,
    reconfigure: bool = False,
    extreme_rates: bool = False,
) -> Result:
    """``reconfigure``: racks with two witnesses whose appliances list one of them, and
    an operator who swaps it (restarting the appliance) on one appliance at a time."""
    with deterministic_scheduler(seed):
        return trio.run(
            _run, seed, duration, timing, trace, reconfigure, extreme_rates,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )  # fmt: skip


async def _run(
    seed: int,
    duration: float,
    timing: Timing,
    keep_trace: bool,
    reconfigure: bool,
    extreme_rates: bool,
) -> Result:
    pick = random.Random(seed ^ 0x5EED)
    layouts = [(2, 2)] if reconfigure else [(2, 1), (2, 1), (3, 0), (2, 2), (3, 1), (3, 2)]
    appliances, witnesses = pick.choice(layouts)
    world = World(
        seed, appliances=appliances, witnesses=witnesses, timing=timing,
        drift=timing.max_clock_rate_error, extreme_rates=extreme_rates,
    )  # fmt: skip
    world.reconfigure = reconfigure
    if reconfigure:  # half the racks start misconfigured: the last appliance lists w1
        for name in world.names:
            world.processes[name].listed_witnesses = world.witnesses[:1]
        if pick.random() < 0.5:
            world.processes[world.names[-1]].listed_witnesses = world.witnesses[1:2]
    if keep_trace:
        world.trace = []
    faults = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(world.network.run)
        nursery.start_soon(world.network.adversary)
        for process in world.processes.values():
            process.start(nursery)
        rng = world.rng
        while trio.current_time() < duration - HEAL:
            await trio.sleep(rng.uniform(0.1, 2.0))
            faults += 1
            _fault(world, rng, nursery)
        _heal(world, nursery)
        await trio.sleep(HEAL)
        holders = world.holders()
        if len(holders) != 1:
            world.checker.fail(f"no single holder {HEAL} s after healing: {holders}")
        nursery.cancel_scope.cancel()
    checker = world.checker
    return Result(
        seed, world.digest, checker.violations, f"{appliances} appliances + {witnesses} witnesses",
        checker.acquisitions, checker.grants, checker.effects, checker.failovers,
        checker.stale_resumes, faults, world.network.sent,
        world.trace,
    )  # fmt: skip


def _fault(world: World, rng, nursery: trio.Nursery) -> None:
    names = list(world.processes)
    process = world.processes[rng.choice(names)]
    holders = world.holders()
    if holders and rng.random() < 0.5:  # the holder's failures are the interesting ones
        process = world.processes[holders[0]]
    faults = world.network.faults
    kind = rng.choices(
        ["kill", "restart", "pause", "partition", "one-way", "loss", "duplicate", "delay", "heal",
         "reconfigure", "promote", "slow-link"],
        # with reconfigurations, partitions between appliances whose configurations
        # differ are what a membership check by count gets wrong
        weights=[3, 3, 4, 8, 2, 2, 1, 2, 2, 4, 4, 2] if world.reconfigure
        else [3, 3, 4, 3, 2, 2, 1, 2, 2, 0, 0, 3],
    )[0]  # fmt: skip
    if kind == "promote":  # an operator asks a standby to take over (a hand-over)
        standby = world.processes[rng.choice(world.names)]
        if standby.alive and not standby.active and standby.runner is not None:
            standby.runner.election.promote(standby.clock.now())
            standby.runner.poke()
            process = standby
    elif kind == "reconfigure":
        # the operator swaps the witness one appliance lists, and restarts it
        appliance = world.processes[rng.choice(world.names)]
        listed = appliance.listed_witnesses or world.witnesses
        appliance.listed_witnesses = [w for w in world.witnesses if w not in listed][:1] or listed
        if appliance.alive:
            appliance.kill()
        nursery.start_soon(_restart_later, appliance, rng.uniform(0.0, 1.5), nursery)
        process = appliance
    elif kind == "kill" and process.alive:
        process.kill()
    elif kind == "restart":
        if process.alive:
            process.kill()
        nursery.start_soon(_restart_later, process, rng.uniform(0.0, 1.5), nursery)
    elif kind == "pause" and process.alive and process.paused_at is None:
        process.pause()
        # often past the lease: that is the interesting case
        nursery.start_soon(_resume_later, process, rng.uniform(0.05, 3.0), nursery)
    elif kind in ("partition", "one-way"):
        other = rng.choice([n for n in names if n != process.name])
        faults.cut.add((process.name, other))
        if kind == "partition":
            faults.cut.add((other, process.name))
    elif kind == "loss":
        faults.drop = rng.choice([0.0, 0.05, 0.2, 0.5])
    elif kind == "duplicate":
        faults.duplicate = rng.choice([0.0, 0.1, 0.3])
    elif kind == "delay":
        high = rng.choice([0.002, 0.02, 0.1, 0.3])
        faults.delay = (high / 10, high)
    elif kind == "slow-link":
        # everything arriving at one node late, near the round timeout (a congested
        # queue): answers that come back late are what validity counted from the grant,
        # rather than from the round's start, gets wrong
        delay = rng.uniform(0.25, 0.5) * world.timing.round_timeout  # the round still fits
        for other in names:
            if other != process.name:
                faults.slow[(other, process.name)] = delay
    elif kind == "heal":
        faults.cut.clear()
        faults.slow.clear()
    world.note(f"fault {kind} {process.name} cut={sorted(faults.cut)} drop={faults.drop}")


async def _restart_later(process, after: float, nursery: trio.Nursery) -> None:
    await trio.sleep(after)
    if not process.alive:
        process.start(nursery)


async def _resume_later(process, after: float, nursery: trio.Nursery) -> None:
    await trio.sleep(after)
    if process.paused_at is not None:
        process.resume(nursery)


def _heal(world: World, nursery: trio.Nursery) -> None:
    world.network.faults = Faults()
    if world.reconfigure:  # the rollout is finished: every appliance lists the first's witness
        final = world.processes[world.names[0]].listed_witnesses
        for name in world.names[1:]:
            process = world.processes[name]
            if process.listed_witnesses != final:
                process.listed_witnesses = final
                process.kill()
    for process in world.processes.values():
        if process.paused_at is not None:
            process.resume(nursery)
        if not process.alive:
            process.start(nursery)
    world.note("healed")


def summary(results: list[Result]) -> str:
    failed = [r for r in results if not r.ok]
    total = len(results)
    lines = [
        f"{total} seeds: {total - len(failed)} passed, {len(failed)} failed",
        f"  acquisitions {sum(r.acquisitions for r in results)} (failovers "
        f"{sum(r.failovers for r in results)}), grants {sum(r.grants for r in results)}, "
        f"outward effects {sum(r.effects for r in results)}, holders resumed after their lease "
        f"{sum(r.stale_resumes for r in results)}, faults {sum(r.faults for r in results)}, "
        f"messages {sum(r.messages for r in results)}",
    ]
    for r in failed:
        lines.append(f"  seed {r.seed} ({r.layout}): {r.violations[0]}")
    if failed:
        lines.append("  failing seeds: " + " ".join(str(r.seed) for r in failed))
        lines.append("  replay one: python -m tests.simulation --seed SEED --trace")
    return "\n".join(lines)
