"""Text for ``rackboot machines list|show`` (sans-IO)."""

from __future__ import annotations

import time
from typing import Any


def render_list(machines: list[dict[str, Any]]) -> str:
    if not machines:
        return "no machines"
    lines = [f"{'NAME':<16} {'STATE':<12} {'PROFILE':<14} {'POOL':<10} TRY  DEADLINE"]
    for m in machines:
        deadline = _when(m["deadline"])
        flag = "  deprovision" if m["deprovision"] else ""
        lines.append(f"{m['name']:<16} {m['state']:<12} {m['profile'] or '-':<14} "
                     f"{m['pool'] or '-':<10} {m['attempt']:<4} {deadline}{flag}")  # fmt: skip
    return "\n".join(lines)


def render_show(record: dict[str, Any]) -> str:
    lines = [f"{record['name']}: {record['state']} (profile {record['profile'] or '-'}, "
             f"pool {record['pool'] or '-'}, attempt {record['attempt']})",
             f"  MACs: {', '.join(record['macs']) or '-'}",
             f"  deadline: {_when(record['deadline'])}"]  # fmt: skip
    for key in ("replaces", "twin"):
        if record.get(key):
            lines.append(f"  {key}: {record[key]}")
    if record.get("deprovision"):
        lines.append("  marked for deprovisioning")
    for at, state, why in record.get("history", []):
        lines.append(f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(at))}Z  {state:<12} {why}")
    return "\n".join(lines)


def _when(deadline: float | None) -> str:
    if deadline is None:
        return "-"
    return time.strftime("%H:%M:%SZ", time.gmtime(deadline))
