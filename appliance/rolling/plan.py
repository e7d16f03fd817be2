"""The rolling update of a rack's appliances, decided one look at a time (sans-IO).

A roll updates every appliance of the rack to one bundle, one appliance at a
time, standbys first and the lease holder last, so the rack keeps answering:

1. **apply** to the next appliance (not the holder): it fetches the bundle,
   its updater installs it and restarts it into the new version;
2. wait until it is back on that version, judged healthy by its updater (no
   longer on trial), and caught up with the holder's state log; its updater
   reporting a failed health check for this version (it rolled itself back)
   **stops the roll**, and so does a deadline;
3. when the next appliance is the holder itself: **hand the lease over** to an
   appliance already updated (a graceful hand-over, docs/ha.md), which, holding
   the lease, carries on from the record; the old holder is then updated as
   in 1-2.

The roll is a record in the replicated state log (written by the holder only,
so it is on every appliance and survives the orchestrating appliance's own
reboot: whoever holds the lease drives it). :func:`step` takes the record,
this node's id, what was just seen of each appliance and ``now`` (wall-clock
seconds, as the record keeps them), and returns the record as it should be
and what to do; the shell carries that out and looks again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

RUNNING, DONE, FAILED = "running", "done", "failed"
APPLY, APPLYING, HANDOVER = "apply", "applying", "handover"
HANDOVER_RETRY = 15.0  # s: ask for the hand-over again if the lease has not moved


class RollError(ValueError):
    """A roll that cannot start (or a record that is not one); the text says why."""


@dataclass(frozen=True)
class Seen:
    """One appliance as the orchestrator saw it on this look."""

    reachable: bool
    version: str = ""  # the firmware version it runs ("" unknown)
    trial: bool = False  # booted a version its updater has not judged healthy yet
    failed: str = ""  # the version its updater last rolled back from ("" none)
    why: str = ""  # and why (its health check's words)
    busy: str = ""  # what it is doing for the roll now (fetching, installing, ...)
    error: str = ""  # why it could not fetch or install this roll's bundle ("" none)
    caught_up: bool = False  # follows the holder with everything committed


@dataclass(frozen=True)
class Apply:
    """Ask ``node`` to fetch and install the bundle and restart into it."""

    node: str


@dataclass(frozen=True)
class HandOver:
    """Hand this node's lease over to ``to`` (updated already)."""

    to: str


@dataclass(frozen=True)
class Saved:
    """Write the record (it changed)."""


Action = Apply | HandOver | Saved


@dataclass
class Roll:
    id: str
    bundle: str  # its SHA-256, hex
    size: int
    version: str  # the firmware version it installs
    order: list[str]  # appliances in the order they update: the holder at start last
    sources: list[str]  # appliances that have the bundle
    started_by: str
    started_at: float
    timeout: float  # s an appliance has, per step, to come back updated
    state: str = RUNNING
    reason: str = ""
    step: int = 0  # order[step] is being updated
    phase: str = APPLY
    since: float = 0.0  # when the phase began
    asked: float = 0.0  # when the hand-over was last asked
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> from, state, note

    @property
    def current(self) -> str | None:
        return self.order[self.step] if self.state == RUNNING else None

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def start(roll_id: str, bundle: str, size: int, version: str, *, me: str,
          appliances: list[str], versions: dict[str, str], now: float,
          timeout: float) -> Roll:  # fmt: skip
    """A new roll started on the holder ``me``: the other appliances first (by id), then
    ``me``. ``versions``: what each runs now."""
    if all(versions.get(a) == version for a in appliances):
        raise RollError(f"every appliance of the rack runs version {version} already")
    order = sorted(a for a in appliances if a != me) + [me]
    nodes = {a: {"from": versions.get(a, ""), "state": "pending", "note": ""} for a in order}
    return Roll(roll_id, bundle, size, version, order, [me], me, now, timeout, since=now,
                nodes=nodes)  # fmt: skip


def from_record(value: Any) -> Roll:
    """The roll a state log record holds (:class:`RollError` if it is not one)."""
    if not isinstance(value, dict):
        raise RollError("the roll record is not a map")
    try:
        roll = Roll(**value)
    except TypeError as exc:
        raise RollError(f"the roll record does not fit: {exc}") from None
    if not roll.order or not 0 <= roll.step <= len(roll.order):
        raise RollError("the roll record names no appliance to update")
    return roll


def step(roll: Roll, me: str, seen: dict[str, Seen], now: float) -> tuple[Roll, list[Action]]:
    """One look by the holder ``me``: the roll as it should be now, and what to do."""
    if roll.state != RUNNING:
        return roll, []
    new = dataclasses.replace(roll, nodes={k: dict(v) for k, v in roll.nodes.items()})
    actions = _look(new, me, seen, now)
    if new != roll and not any(isinstance(a, Saved) for a in actions):
        actions.append(Saved())
    return new, actions


def fail(roll: Roll, node: str, reason: str, now: float, state: str = "failed") -> None:
    """Stop the roll at ``node``: nothing more is applied; the text says why."""
    roll.state, roll.reason, roll.since = FAILED, f"{node}: {reason}", now
    roll.nodes[node].update(state=state, note=reason)


def _look(roll: Roll, me: str, seen: dict[str, Seen], now: float) -> list[Action]:
    node = roll.order[roll.step]
    look = seen.get(node, Seen(reachable=False))
    entry = roll.nodes[node]
    if roll.phase == HANDOVER and node != me:
        _phase(roll, APPLY, now)  # the lease moved here: the old holder is next
    if roll.phase == APPLY:
        if node == me:
            return _hand_over(roll, me, seen, now)
        if not look.reachable:
            return _waited(roll, node, now, "unreachable")
        if look.version == roll.version and not look.trial:
            return _applying(roll, node, look, now)  # runs it already: only catching up
        _phase(roll, APPLYING, now)
        entry.update(state="applying", note="")
        return [Saved(), Apply(node)]
    if roll.phase == HANDOVER:
        if now - roll.asked < HANDOVER_RETRY or now - roll.since > roll.timeout:
            return _waited(roll, node, now, "the lease was not handed over")
        return _hand_over(roll, me, seen, now)
    return _applying(roll, node, look, now)


def _applying(roll: Roll, node: str, look: Seen, now: float) -> list[Action]:
    entry = roll.nodes[node]
    if look.error:
        fail(roll, node, f"could not install the bundle: {look.error}", now)
        return []
    if look.failed == roll.version:
        fail(roll, node, f"its health check failed on {roll.version}, it rolled back: "
             f"{look.why or 'no reason given'}", now, state="rolled back")  # fmt: skip
        return []
    if not look.reachable:
        entry["note"] = "restarting"
        return _waited(roll, node, now, "not back")
    if look.version == roll.version and not look.trial and look.caught_up:
        entry.update(state="updated", note="")
        roll.step += 1
        if roll.step == len(roll.order):
            roll.state, roll.since = DONE, now
        else:
            _phase(roll, APPLY, now)
        return []
    entry["note"] = (
        look.busy or ("health check" if look.trial else "")
        or ("catching up" if look.version == roll.version else f"runs {look.version or '?'}")
    )  # fmt: skip
    return _waited(roll, node, now, f"not back on {roll.version} and healthy")


def _hand_over(roll: Roll, me: str, seen: dict[str, Seen], now: float) -> list[Action]:
    """The holder is next: hand its lease to an updated appliance that follows it."""
    updated = [n for n in roll.order[: roll.step]
               if roll.nodes[n]["state"] == "updated" and seen.get(n, Seen(False)).caught_up]  # fmt: skip
    if not updated:
        return _waited(roll, me, now, "no updated appliance to hand the lease to")
    if roll.phase != HANDOVER:
        _phase(roll, HANDOVER, now)
    roll.asked = now
    roll.nodes[me]["note"] = f"handing the lease to {updated[-1]}"
    return [Saved(), HandOver(updated[-1])]


def _phase(roll: Roll, phase: str, now: float) -> None:
    roll.phase, roll.since = phase, now


def _waited(roll: Roll, node: str, now: float, what: str) -> list[Action]:
    if now - roll.since > roll.timeout:
        fail(roll, node, f"{what} within {roll.timeout:g} s", now)
    return []
