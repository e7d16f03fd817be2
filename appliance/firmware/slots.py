"""The A/B slot state machine (sans-IO): which slot boots, and the steps of an update.

The state is what the ESP holds, one entry per slot: a generation and
systemd-boot's boot counter (https://systemd.io/AUTOMATIC_BOOT_ASSESSMENT/).
On the ESP it is the entry's file name, ``rackboot-7-b+2-1.conf``: generation
7, 2 tries left, 1 done; ``rackboot-7-b.conf`` (no counter) is good, ``+0``
is bad. loader.conf says ``default rackboot-*`` once and for all, and
systemd-boot takes the first matching entry in its own order: entries with no
tries left last, then the highest generation (it sorts ids downwards by
version comparison). So the slot to boot is the best entry that is not bad; a
bad entry is booted only when both are. Booting a counting entry moves one try
from left to done. The BIOS loader (GRUB, image/grub.cfg) keeps the same
entries in its environment block and chooses by the same rule.

Every step of :func:`plan_update` changes one slot's entry (one rename on the
ESP) or one slot's partition, so a power loss between any two leaves a state
that :func:`boot` resolves to a slot whose content is intact: the target is
marked bad before it is written, and it becomes the preferred, counting entry
only once its content has been verified (:class:`Promote`). A slot on trial
that fails its health check is marked bad (:func:`after_boot`) and the next
boot goes back; one that passes is blessed (its counter dropped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

SLOTS = ("a", "b")
TRIES = 3  # boots a new slot gets to pass its health check
MAX_GENERATION = 10**9
ENTRY_RE = re.compile(r"rackboot-(\d{1,9})-([ab])(?:\+(\d)(?:-(\d))?)?\.conf")


class SlotError(ValueError):
    """An update that cannot be planned, or an entry name that is not ours."""


@dataclass(frozen=True)
class Entry:
    generation: int
    left: int | None = None  # None: no counter (good); 0: bad
    done: int = 0

    @property
    def good(self) -> bool:
        return self.left is None

    @property
    def bad(self) -> bool:
        return self.left == 0


State = dict[str, Entry]  # slot -> its entry


def other(slot: str) -> str:
    return SLOTS[1 - SLOTS.index(slot)]


def entry_name(slot: str, entry: Entry) -> str:
    stem = f"rackboot-{entry.generation}-{slot}"
    return f"{stem}.conf" if entry.left is None else f"{stem}+{entry.left}-{entry.done}.conf"


def parse_entry_name_untrusted(name: str) -> tuple[str, Entry]:
    """The slot and entry an ESP file name says; :class:`SlotError` for a name
    that is not ours."""
    match = ENTRY_RE.fullmatch(name)
    if match is None:
        raise SlotError(f"{name!r} is not a rackboot-GENERATION-{{a,b}}[+LEFT[-DONE]].conf entry")
    left = None if match[3] is None else int(match[3])
    return match[2], Entry(int(match[1]), left, int(match[4] or 0))


def boot_order(state: State) -> list[str]:
    """The slots in the order the boot loader prefers them."""
    return sorted(SLOTS, key=lambda s: (state[s].bad, -state[s].generation, s))


def boot(state: State) -> tuple[State, str]:
    """What the boot loader does at power-on: the slot it boots and the state
    after it counted the try (a bad entry is booted only when both are)."""
    slot = boot_order(state)[0]
    entry = state[slot]
    if entry.left:  # counting, tries left
        entry = replace(entry, left=entry.left - 1, done=min(entry.done + 1, 9))
    return {**state, slot: entry}, slot


# -- the steps of an update: each one file operation -------------------------


@dataclass(frozen=True)
class MarkBad:  # rename the target's entry to +0: never booted while rewritten
    slot: str


@dataclass(frozen=True)
class WriteSlot:  # the writer: the partition and the slot's kernel and initrd on the ESP
    slot: str


@dataclass(frozen=True)
class VerifySlot:  # the writer: re-read all of it and compare the SHA-256s; note the version
    slot: str
    version: str


@dataclass(frozen=True)
class Promote:  # rename the target's entry to the next generation, +TRIES-0
    slot: str


@dataclass(frozen=True)
class Reboot:
    pass


Step = MarkBad | WriteSlot | VerifySlot | Promote | Reboot


def plan_update(state: State, booted: str, version: str) -> list[Step]:
    """The steps that install ``version`` into the slot not running."""
    if not state[booted].good:
        # The running slot is itself on trial: overwriting the other slot would
        # remove the only known-good fallback.
        raise SlotError(f"slot {booted} is not marked good yet: mark it good (or let it "
                        "roll back) before updating")  # fmt: skip
    target = other(booted)
    return [MarkBad(target), WriteSlot(target), VerifySlot(target, version), Promote(target),
            Reboot()]  # fmt: skip


def apply(state: State, step: Step) -> State:
    """``state`` after ``step`` (the ESP's entries; writing and verifying a
    partition change no entry)."""
    match step:
        case MarkBad(slot):
            return {**state, slot: replace(state[slot], left=0, done=0)}
        case Promote(slot):
            generation = max(e.generation for e in state.values()) + 1
            if generation > MAX_GENERATION:
                raise SlotError(f"generation {generation} exceeds {MAX_GENERATION}")
            return {**state, slot: Entry(generation, TRIES, 0)}
    return state


def after_boot(state: State, booted: str, health_ok: bool) -> State:
    """What the booted system does once its health check has run. Only a slot
    on trial (counting) is judged: a pass blesses it (drops its counter), a
    failure marks it bad, so the next boot goes back (:func:`must_reboot`). A
    good slot stays good whatever the check says: it is the fallback, and a
    peer that is down must not make an appliance distrust its last good slot."""
    entry = state[booted]
    if entry.good:
        return state
    if health_ok:
        return {**state, booted: Entry(entry.generation)}
    return {**state, booted: replace(entry, left=0)}


def must_reboot(state: State, booted: str) -> bool:
    """Whether the next boot would choose another slot than the running one
    (the health check failed and a fallback exists)."""
    return boot_order(state)[0] != booted and not state[boot_order(state)[0]].bad


def status(state: State, booted: str | None) -> dict[str, object]:
    """The slots as `rackboot firmware status` shows them."""
    return {
        "booted": booted,
        "next_boot": boot_order(state)[0],
        "slots": {slot: {"entry": entry_name(slot, e), "generation": e.generation,
                         "state": "good" if e.good else "bad" if e.bad else "on trial",
                         "tries_left": e.left} for slot, e in sorted(state.items())},
    }  # fmt: skip
