"""The faults a schedule draws from, each ``(world, rng, the process it picked)``.

Most act at once; the scripted scenarios (``amnesia``, ``lower-lease``) return a
coroutine the schedule awaits, so no other fault lands in the middle of one. Their
later steps (restarts, maintenance off) run in ``world.schedule``, which ends at
healing.
"""

from __future__ import annotations

import trio

from appliance.ha.schema import Timing
from tests.simulation.checker import COVER
from tests.simulation.world import Faults, Process, Trap, World


def target(world: World, rng) -> Process:
    holders = world.holders()
    if holders and rng.random() < 0.5:  # the holder's failures are the interesting ones
        return world.processes[holders[0]]
    return world.processes[rng.choice(list(world.processes))]


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
    if world.replicated and not process.witness:
        steps += ["fsync", "fsynced", "replicate", "replicate"]  # replicas.py's steps
    step = rng.choice(steps)
    if step in ("checked", "replicate"):
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
            world.schedule.start_soon(
                _later, rng.uniform(0.2, 3.0), process.command, "maintenance off"
            )

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


# -- the replicated state log (replicas.py) ----------------------------------------------


def power(world, rng, process):
    """The rack loses power: every appliance at once (the witnesses are elsewhere), each
    back 0.2-1.5 s later with what its disk had made durable."""
    world.checker.seen["rack power cuts"] += 1
    for name in world.names:
        _restart(world, world.processes[name], rng.uniform(0.2, 1.5))


def crash_mid_fsync(world, rng, process):
    """Power lost on an appliance while its fsync is in flight (a standby's when one is, so
    that its acknowledgement races its disk), and half the time on the holder just after."""
    return _crash_mid_fsync(world, rng)


async def _crash_mid_fsync(world: World, rng) -> None:
    holders = world.holders()
    for _ in range(200):
        busy = [n for n in world.names if world.processes[n].fsyncs]
        candidates = [n for n in busy if n not in holders] or busy
        if candidates:
            break
        await trio.sleep(0.001)
    else:
        return
    victim = world.processes[rng.choice(candidates)]
    _restart(world, victim, rng.uniform(0.2, 1.5))
    if holders and holders[0] != victim.name and rng.random() < 0.5:
        await trio.sleep(rng.uniform(0.0, 0.3))
        world.checker.seen["holders killed just after a standby's fsync was"] += 1
        _restart(world, world.processes[holders[0]], rng.uniform(0.2, 1.5))


def slow_disk(world, rng, process):
    """An appliance's fsyncs take 50-800 ms for 1-4 s (a stalled virtual disk)."""
    process = _appliance(world, rng)
    process.slow_disk_until = trio.current_time() + rng.uniform(1.0, 4.0)
    world.checker.seen["slow disks"] += 1


def clock_step(world, rng, process):
    """NTP steps an appliance's wall clock by 12-40 s: the holder's pings see the skew."""
    process = _appliance(world, rng)
    process.wall_offset += rng.choice([-1, 1]) * rng.uniform(12.0, 40.0)
    world.checker.seen["wall clocks stepped"] += 1


def isolate_standby(world, rng, process):
    """A standby cut off from the holder (it falls behind and is declared ineligible), then
    the holder dies while the standby is still cut off: docs/state.md, "A dies, B
    ineligible": nobody takes over by itself until the holder is back."""
    holders = world.holders()
    standbys = [n for n in world.names if n not in holders and world.processes[n].alive]
    if not holders or not standbys:
        return
    world.checker.seen["standbys cut off, then the holder killed"] += 1
    return _isolate(world, rng, holders[0], rng.choice(standbys))


async def _isolate(world: World, rng, holder: str, standby: str) -> None:
    links = {(holder, standby), (standby, holder)}
    world.network.faults.cut |= links
    await trio.sleep(rng.uniform(0.8, 2.0))
    _restart(world, world.processes[holder], rng.uniform(0.5, 3.0))
    await trio.sleep(rng.uniform(0.5, 2.0))
    world.network.faults.cut -= links


FAULTS = {
    "kill": kill, "restart": restart, "pause": pause, "trap": trap, "partition": partition,
    "one-way": one_way, "loss": loss, "duplicate": duplicate, "delay": delay,
    "slow-link": slow_link, "heal": heal, "lease": lease, "promote": operator("promote", _standby),
    "force": operator("force", _last_one), "demote": operator("demote"),
    "handover": operator("handover"),
    "maintenance": operator("maintenance on"), "amnesia": amnesia, "lower-lease": lower_lease,
    "reconfigure": reconfigure, "power": power, "crash-mid-fsync": crash_mid_fsync,
    "slow-disk": slow_disk, "clock-step": clock_step, "isolate-standby": isolate_standby,
}  # fmt: skip


def heal_all(world: World) -> None:
    """The last part of a run: every fault lifted, every process running."""
    world.network.faults = Faults()  # a LAN: liveness is promised on a healthy network
    if world.seed_set.finish_rollouts:
        _finish_rollouts(world)
    for process in world.processes.values():
        process.trap = None
        process.wall_offset, process.slow_disk_until = 0.0, 0.0
        if process.paused_at is not None:
            process.resume()
        if not process.alive:
            process.start()
        elif process.election is not None and process.election.maintenance:
            process.command("maintenance off")
    world.note("healed")


def _finish_rollouts(world: World) -> None:
    """Every appliance gets a0's [ha] witnesses and timings (while appliances' leases
    differ a rack may stay without a holder: see test_election_sim.py)."""
    first = world.processes[world.names[0]]
    for name in world.names[1:]:
        process = world.processes[name]
        if (process.listed_witnesses, process.timing) != (first.listed_witnesses, first.timing):
            process.listed_witnesses, process.timing = first.listed_witnesses, first.timing
            process.kill()
