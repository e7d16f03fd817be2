"""What a doctor check is and what it says (sans-IO): the types plugins use too.

A check (:class:`DoctorCheck`) gets a :class:`DoctorContext` (the node's status,
the configuration, the options, the wall-clock time) and returns
:class:`Finding` lines. A finding that is not PASS says why (``reason``) and
what to do (``action``): an operator reading one line must know the next step.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.errors import EXIT_DOCTOR_FAIL, EXIT_DOCTOR_WARN, EXIT_OK, EXIT_UNREACHABLE


class Verdict(enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"  # nothing to judge here (a standalone node has no peers)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Finding:
    check: str  # "time.skew", "dhcp.probe": plugin name first
    verdict: Verdict
    summary: str  # one line: what was found
    reason: str = ""  # why it matters (WARN, FAIL)
    action: str = ""  # what to do about it
    details: tuple[str, ...] = ()  # one line each: a table's rows, the servers heard
    data: Mapping[str, Any] = field(default_factory=dict)  # the facts, for --json

    def as_json(self) -> dict[str, Any]:
        return {
            "check": self.check, "verdict": self.verdict.value, "summary": self.summary,
            "reason": self.reason, "action": self.action, "details": list(self.details),
            "data": dict(self.data),
        }  # fmt: skip


def count(n: int, noun: str, plural: str = "") -> str:
    """``1 peer``, ``2 peers``: the report reads as sentences."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def passed(check: str, summary: str, **more: Any) -> Finding:
    return Finding(check, Verdict.PASS, summary, **more)


def warned(check: str, summary: str, reason: str, action: str, **more: Any) -> Finding:
    return Finding(check, Verdict.WARN, summary, reason, action, **more)


def failed(check: str, summary: str, reason: str, action: str, **more: Any) -> Finding:
    return Finding(check, Verdict.FAIL, summary, reason, action, **more)


def skipped(check: str, summary: str) -> Finding:
    return Finding(check, Verdict.SKIP, summary)


@dataclass(frozen=True)
class DoctorOptions:
    """The command line's choices (``rackboot doctor ...``)."""

    dhcp_probe: str = ""  # interface to send a DHCP DISCOVER on ("": no probe)
    timeout: float = 3.0  # seconds a probe listens
    known_servers: tuple[str, ...] = ()  # more addresses whose DHCP offers are expected

    def requested(self) -> dict[str, str]:
        """The options that ask for a check a plugin runs, when given: {field: value}."""
        return {name: value for name, value in (("dhcp_probe", self.dhcp_probe),) if value}


@dataclass(frozen=True)
class DoctorContext:
    """What every check may read. ``status`` is the running node's ``rackboot status``
    (None when no node answers: ``unreachable`` says why); ``call(cmd, args)`` asks the
    node another control command; ``config`` is the configuration the CLI read (the
    rack's VIP, peers and witnesses); ``wall`` the time the doctor started."""

    config: Any
    options: DoctorOptions
    wall: float
    status: Mapping[str, Any] | None = None
    unreachable: str = ""
    call: Callable[[str, dict[str, Any]], Any] | None = None

    def section(self, name: str) -> Mapping[str, Any]:
        """A plugin's (or the core's) part of the node's status; {} without one."""
        value = (self.status or {}).get(name)
        return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class DoctorCheck:
    """One check, returned by ``rackboot_doctor_checks``: ``run(context)`` gives findings.

    ``needs_node``: the check reads the running node's status; without a node the
    doctor reports it as SKIP instead of running it. ``option``: the
    :class:`DoctorOptions` field that asked for this check (``"dhcp_probe"``): the
    doctor fails an option no loaded plugin answers. ``run`` may do I/O of its own
    (a probe on a link); an exception from it is reported as a FAIL naming the check.
    """

    name: str
    run: Callable[[DoctorContext], Iterable[Finding]]
    needs_node: bool = True
    option: str = ""


def exit_code(findings: Iterable[Finding], reachable: bool) -> int:
    """0 all passed; 6 a warning and no failure; 7 a failure; 4 no node answers
    (whatever else was found: the rest of the report still runs and prints)."""
    verdicts = {f.verdict for f in findings}
    if not reachable:
        return EXIT_UNREACHABLE
    if Verdict.FAIL in verdicts:
        return EXIT_DOCTOR_FAIL
    return EXIT_DOCTOR_WARN if Verdict.WARN in verdicts else EXIT_OK
