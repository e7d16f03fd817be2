"""The doctor's report: one line per finding, the reason and the action under those that
did not pass; or one JSON document (sans-IO)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from appliance.doctor.findings import Finding, Verdict

NAME_WIDTH = 18


def _counts(findings: Sequence[Finding]) -> dict[str, int]:
    return {v.value: sum(1 for f in findings if f.verdict is v) for v in Verdict}


def worst(findings: Sequence[Finding]) -> Verdict:
    for verdict in (Verdict.FAIL, Verdict.WARN, Verdict.PASS):
        if any(f.verdict is verdict for f in findings):
            return verdict
    return Verdict.SKIP


def render_text(findings: Sequence[Finding], verbose: bool = False) -> str:
    lines = []
    for finding in findings:
        lines.append(f"{finding.verdict!s:<5} {finding.check:<{NAME_WIDTH}} {finding.summary}")
        indent = " " * 6
        if finding.verdict in (Verdict.WARN, Verdict.FAIL):
            lines += [f"{indent}why: {finding.reason}"] if finding.reason else []
            lines += [f"{indent}do:  {finding.action}"] if finding.action else []
        if verbose or finding.verdict is not Verdict.PASS:
            lines += [f"{indent}  {line}" for line in finding.details]
    counts = _counts(findings)
    lines.append(
        f"{worst(findings)}: {counts['pass']} passed, {counts['warn']} warned, "
        f"{counts['fail']} failed, {counts['skip']} skipped"
    )
    return "\n".join(lines)


def as_json(findings: Sequence[Finding], exit_code: int, about: Mapping[str, Any]) -> dict:
    """``about``: who was checked (the node's name, rack, role; the socket)."""
    return {
        "verdict": worst(findings).value, "exit_code": exit_code, "counts": _counts(findings),
        **about, "checks": [f.as_json() for f in findings],
    }  # fmt: skip
