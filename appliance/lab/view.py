"""What ``rackboot lab`` shows: the rack's live status and each boot's timings, as text
lines (sans-IO: the appliances' ``status`` answers, the machine's record and the time
come in; nothing is asked or printed here).

One line per appliance (role, epoch, log position, VIP, replication: whom it streams to
and their lag, or whom it follows), one for the witness (how long ago each appliance
last heard it), one for the VM (its provisioning stage, by the active's record).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Stages a machine goes through while it boots (plugins/provisioning, docs/provisioning.md).
STAGES = ("requested", "discovered", "loader", "kernel", "installing", "provisioned")


@dataclass(frozen=True)
class Appliance:
    name: str
    status: Mapping[str, Any] | None  # its `status` answer; None: no answer
    note: str = ""  # why there is none ("killed", "starting")


def appliance_line(one: Appliance, names: Mapping[str, str]) -> str:
    """``names``: node id -> the lab's name for it (a, b, w)."""
    if one.status is None:
        return f"{one.name}  {one.note or 'not answering'}"
    core = one.status.get("core", {})
    ha = core.get("ha", {})
    state = core.get("state", {})
    election = ha.get("election", {})
    epoch = ha.get("epoch") or election.get("known_epoch") or "-"
    vip = "VIP" if ha.get("vip", {}).get("held") else "   "
    return (
        f"{one.name}  {ha.get('role', core.get('role', '?')):<8} epoch {epoch:<3} "
        f"log {state.get('lsn', '-'):<5} {vip}  {_replication(state.get('replication', {}), names)}"
    )


def appliance_key(one: Appliance) -> tuple[Any, ...]:
    """What a change of deserves a new block where the block is not redrawn in place:
    role, epoch, VIP, replication stages; not the log position or lag, which move."""
    if one.status is None:
        return (one.name, one.note)
    core = one.status.get("core", {})
    ha, replication = core.get("ha", {}), core.get("state", {}).get("replication", {})
    stages = sorted(f.get("stage") for f in (replication.get("followers") or {}).values())
    following = (replication.get("following") or {}).get("stage")
    held = ha.get("vip", {}).get("held")
    return (one.name, ha.get("role"), ha.get("epoch"), held, tuple(stages), following)


def _replication(replication: Mapping[str, Any], names: Mapping[str, str]) -> str:
    followers = replication.get("followers") or {}
    if followers:
        parts = [
            f"{names.get(peer, peer)} {f.get('stage', '?')} lag {f.get('lag', '?')}"
            + ("" if f.get("counted", True) else " (not counted)")
            for peer, f in sorted(followers.items())
        ]
        return "streams to " + ", ".join(parts)
    following = replication.get("following") or {}
    if following:
        leader = following.get("leader", "?")
        return f"follows {names.get(leader, leader)} ({following.get('stage', '?')})"
    return "no replication"


def witness_line(name: str, witness_id: str, appliances: Sequence[Appliance]) -> str:
    """How long ago each answering appliance last heard the witness's signed datagrams."""
    heard = []
    for one in appliances:
        if one.status is None:
            continue
        ago = one.status.get("core", {}).get("ha", {}).get("transport", {}).get("heard", {})
        if witness_id in ago:
            heard.append(f"{one.name} {ago[witness_id]:.2f} s ago")
    return f"{name}  witness  heard by " + (", ".join(heard) if heard else "nobody")


def machine_line(name: str, record: Mapping[str, Any] | None, now: float) -> str:
    """The VM's stage by the rack's record; ``now``: wall-clock time."""
    if record is None:
        return f"{name}  no record (no active appliance answers)"
    state = record.get("state", "?")
    since = record.get("since") or now
    attempt = record.get("attempt", 0)
    retry = f", retry {attempt}" if attempt else ""
    return f"{name}  {state:<11} for {max(0.0, now - since):5.1f} s{retry}"


def status_block(header: str, lines: Sequence[str]) -> list[str]:
    return [header, *(f"  {line}" for line in lines)]


def stage_times(history: Sequence[Sequence[Any]], requested: float) -> list[tuple[str, float]]:
    """Each stage the record entered at or after ``requested`` (wall clock), first entry
    of each, with its seconds since then: the boot's timings, from the rack's own clock."""
    seen: dict[str, float] = {}
    for when, state, _why in history:
        if when >= requested and state in STAGES and state not in seen:
            seen[state] = when - requested
    return sorted(seen.items(), key=lambda item: item[1])


def timings_text(stages: Sequence[tuple[str, float]]) -> str:
    return ", ".join(f"{state} {seconds:.1f} s" for state, seconds in stages)
