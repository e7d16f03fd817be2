"""``rackboot state backup FILE`` and ``rackboot state restore FILE`` (appliance/state/backup.py)."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.errors import EXIT_OK, Unreachable

Wrap = Callable[[argparse.ArgumentParser], argparse.ArgumentParser]


def add_commands(sub: Any, with_config: Wrap, with_query: Wrap) -> None:
    state = sub.add_parser("state", help="the replicated state: backup, restore")
    actions = state.add_subparsers(dest="state_command", metavar="ACTION", required=True)
    backup = with_query(with_config(actions.add_parser(
        "backup", help="write a snapshot of the committed state to FILE (the node may run)")))  # fmt: skip
    backup.add_argument("file", metavar="FILE")
    restore = with_config(actions.add_parser(
        "restore", help="replace the state with a backup (the node stopped)"))  # fmt: skip
    restore.add_argument("file", metavar="FILE")
    restore.add_argument("--json", action="store_true", help="machine-readable output")
    for parser in (backup, restore):
        parser.set_defaults(func=cmd_state)


def cmd_state(args: argparse.Namespace) -> int:
    from appliance import control
    from appliance.loader import node_settings, resolve_source
    from appliance.state import backup

    path = Path(os.path.abspath(args.file))  # the node's working directory is not ours
    node = node_settings(resolve_source(args.config, args.dev))
    data_dir = Path(node.data_dir)
    if args.state_command == "restore":
        result = backup.restore(data_dir, path, time.time())
    else:
        socket = args.socket or node.control_socket or str(data_dir / "control.sock")
        try:
            result = control.call(socket, "state.backup", {"path": str(path)}, timeout=120)
            result["from"] = "the running node"
        except Unreachable:
            if args.socket is not None:
                raise
            result = backup.backup_offline(data_dir, path)
            result["from"] = "the log on disk (no node answers)"
    print(control.dumps(result, indent=2, sort_keys=True) if args.json else render(args, result))
    return EXIT_OK


def render(args: argparse.Namespace, result: dict[str, Any]) -> str:
    spread = ", ".join(f"{ns} {n}" for ns, n in result["namespaces"].items()) or "no keys"
    what = f"epoch {result['epoch']} lsn {result['lsn']}: {result['keys']} keys ({spread})"
    if args.state_command == "backup":
        return (
            f"backed up {what} from {result['from']} to {result['path']} ({result['bytes']} bytes)"
        )
    lines = [f"restored {what} from {result['source']} into {result['path']}"]
    if result.get("kept_aside"):
        lines.append(f"the previous log is kept at {result['kept_aside']}")
    return "\n".join(lines)
