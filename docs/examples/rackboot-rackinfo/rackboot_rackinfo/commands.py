"""``rackboot rackinfo machines``: the plugin's CLI command, in a module that imports no
service, so that the CLI can import it alone (pyproject.toml declares it in the
``rackboot.cli`` entry points: the command answers without loading every plugin)."""

from __future__ import annotations

from typing import Any

from appliance.api import CliCommand

from rackboot_rackinfo.wire import state_text


def render_machines(machines: dict[str, Any]) -> str:
    if not machines:
        return "no machines"
    return "\n".join(f"{mac}  {state_text(record)}  seq {record['seq']}"
                     for mac, record in sorted(machines.items()))  # fmt: skip


COMMANDS = [
    CliCommand(("rackinfo", "machines"), "machines' install state (rackinfo)",
               "rackinfo.machines", render=render_machines),
]  # fmt: skip
