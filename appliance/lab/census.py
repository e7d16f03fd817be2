"""Whose network namespaces are these? ``rackboot lab``'s judgement of what it finds at
start (sans-IO: names and owners in, a verdict out; appliance/lab/leftovers.py looks).

Every namespace of a lab is named ``rblab<id>-<host>``; while the lab runs, it holds a
lock on its record ``<id>.lock``. A lab whose record is there but unlocked died without
tearing down (SIGKILL, a crash, a power cut would have cleared /run): its namespaces
and processes are stale and ours to remove. A running lab's are left alone. A
namespace with our prefix and no record at all is nobody's we can prove: refused,
named, never removed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

PREFIX = "rblab"
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]{{6}})-[a-z0-9]+$")


def lab_of(namespace: str) -> str | None:
    """The lab id in a namespace's name, or None for a namespace that is not a lab's."""
    match = _NAME.match(namespace)
    return match.group(1) if match else None


def by_lab(namespaces: Iterable[str]) -> dict[str, list[str]]:
    """The lab namespaces among ``namespaces``, by lab id (sorted names)."""
    found: dict[str, list[str]] = {}
    for name in sorted(namespaces):
        lab = lab_of(name)
        if lab is not None:
            found.setdefault(lab, []).append(name)
    return found


@dataclass(frozen=True)
class Verdict:
    """What to do with what was found, by lab id: each lab's namespaces."""

    stale: dict[str, list[str]] = field(default_factory=dict)  # owner gone: remove
    running: dict[str, list[str]] = field(default_factory=dict)  # owner alive: leave alone
    unowned: dict[str, list[str]] = field(default_factory=dict)  # no record: refuse

    def refusal(self) -> str:
        """The error to give when some namespaces are unowned ('' when none are)."""
        if not self.unowned:
            return ""
        names = ", ".join(n for names in self.unowned.values() for n in names)
        return (
            f"network namespaces {names} look like a lab's (prefix {PREFIX}) but no lab "
            f"record owns them, so they are not removed; if no lab uses them, delete each "
            f"with `ip netns del NAME` (after ending what runs in it: `ip netns pids NAME`)"
        )


def judge(namespaces: Iterable[str], records: Mapping[str, bool]) -> Verdict:
    """``records``: every lab record found, by id: True while its owner holds the lock."""
    found = by_lab(namespaces)
    verdict = Verdict()
    for lab in sorted(set(found) | set(records)):
        names = found.get(lab, [])
        if lab not in records:
            verdict.unowned[lab] = names
        elif records[lab]:
            verdict.running[lab] = names
        else:
            verdict.stale[lab] = names  # a record without namespaces is stale too
    return verdict
