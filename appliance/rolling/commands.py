"""`rackboot firmware roll` (docs/updates.md): start a rolling update of the rack from
either appliance and follow it. Imports nothing heavy until it runs."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from appliance.errors import EXIT_FAILURE, EXIT_OK, Unreachable

POLL = 1.0  # s between looks at the roll
START_TIMEOUT = 600.0  # s the node has to copy the bundle in and check it


def add_roll_command(firmware: argparse.ArgumentParser, with_config: Any) -> None:
    """``roll`` under ``rackboot firmware`` (its subcommands are appliance/firmware's)."""
    actions = next(a for a in firmware._actions if isinstance(a, argparse._SubParsersAction))
    roll = with_config(actions.add_parser(
        "roll", help="update every appliance of the rack, one at a time, without a failover"))  # fmt: skip
    roll.add_argument("bundle", metavar="BUNDLE", nargs="?", help="the signed bundle to roll out")
    roll.add_argument("--timeout", type=float, default=900.0,
                      help="seconds each appliance has to come back updated (default 900)")  # fmt: skip
    roll.add_argument("--no-wait", action="store_true", help="start it and return")
    roll.add_argument("--json", action="store_true", help="machine-readable output")
    roll.add_argument("--socket", metavar="PATH", help="control socket")
    roll.set_defaults(func=cmd_roll)


def cmd_roll(args: argparse.Namespace) -> int:
    from appliance import control
    from appliance.cli import control_path

    sock = control_path(args)
    if args.bundle:
        request = {"bundle": os.path.abspath(args.bundle), "timeout": args.timeout}
        status = control.call(sock, "roll.start", request, timeout=START_TIMEOUT)
    else:
        status = control.call(sock, "roll.status")
    shown = ""
    while True:
        text = control.dumps(status, sort_keys=True) if args.json else render(status)
        if text != shown:
            print(text, flush=True)
            shown = text
        roll = status.get("roll") or {}
        if args.no_wait or roll.get("state") != "running":
            return EXIT_FAILURE if roll.get("state") == "failed" else EXIT_OK
        time.sleep(POLL)
        status = _status_across_restarts(control, sock, status, args.timeout)


def _status_across_restarts(control: Any, sock: str, last: dict, timeout: float) -> dict:
    """This appliance's node restarts during the roll: wait for it (up to ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return control.call(sock, "roll.status")
        except Unreachable:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL)


def render(status: dict[str, Any]) -> str:
    firmware = status.get("firmware") or {}
    lines = [f"this appliance: version {firmware.get('version') or '-'}"
             + (" (on trial)" if firmware.get("trial") else "")
             + (f", {status['busy']}" if status.get("busy") else "")]  # fmt: skip
    roll = status.get("roll")
    if not roll:
        return "\n".join(lines + ["no roll"])
    lines.append(f"roll {roll['id']} to {roll['version']}: {roll['state']}"
                 + (f": {roll['reason']}" if roll.get("reason") else ""))  # fmt: skip
    for n, node in enumerate(roll["order"]):
        entry = roll["nodes"].get(node, {})
        mark = ">" if roll["state"] == "running" and n == roll["step"] else " "
        note = f" ({entry['note']})" if entry.get("note") else ""
        lines.append(f" {mark} {node}: {entry.get('state')} from {entry.get('from') or '?'}{note}")
    return "\n".join(lines)
