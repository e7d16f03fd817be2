"""The node itself: does it answer, is it ready, do its services run (sans-IO)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.doctor.findings import Finding, count, failed, passed, warned


def judge_node(status: Mapping[str, Any] | None, unreachable: str) -> Finding:
    if status is None:
        return failed(
            "node", f"no node answers: {unreachable}",
            "nothing serves DHCP, TFTP or HTTP boot from this appliance, and every check "
            "that asks the node is skipped",
            "start it (`systemctl start rackboot` or `rackboot run`); if it runs, point the "
            "doctor at its socket (--config FILE or --socket PATH)",
        )  # fmt: skip
    core = status.get("core", {})
    who = (
        f"node {core.get('name')} (rack {core.get('rack')}), {core.get('role')}, version "
        f"{core.get('version')}, up {core.get('uptime', 0):.0f} s, pid {core.get('pid')}"
    )
    if not core.get("ready"):
        return warned(
            "node", f"{who}: still starting",
            "a node that is not ready may not serve yet (services start one after another)",
            "wait a few seconds and run the doctor again; if it stays so, read the node's log",
        )  # fmt: skip
    return passed("node", f"{who}: ready")


def judge_services(status: Mapping[str, Any]) -> Finding:
    services: Mapping[str, str] = status.get("core", {}).get("services", {})
    by_state: dict[str, list[str]] = {}
    for name, state in sorted(services.items()):
        by_state.setdefault(state, []).append(name)
    details = tuple(f"{name}: {state}" for name, state in sorted(services.items()))
    if by_state.get("failed"):
        return failed(
            "services", f"failed: {', '.join(by_state['failed'])}",
            "a failed service stops the node; one shown failed has stopped serving",
            "read the node's log for the service's error (`journalctl -u rackboot`)",
            details=details,
        )  # fmt: skip
    waiting = by_state.get("starting", []) + by_state.get("pending", [])
    if waiting:
        return warned(
            "services", f"not started yet: {', '.join(waiting)}",
            "a service that has not started does not serve",
            "wait; if it stays so, the node's log tells what it waits for", details=details,
        )  # fmt: skip
    done = by_state.get("stopped", [])
    note = f" ({', '.join(done)} finished: nothing to serve)" if done else ""
    running = len(by_state.get("running", []))
    return passed("services", f"{count(running, 'service')} running{note}", details=details)
