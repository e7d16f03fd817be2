"""``rackboot leases list``: the command line of the dhcp plugin (declared in the
``rackboot.cli`` entry points: the CLI imports this module alone to run it)."""

from __future__ import annotations

from typing import Any

from appliance.api import CliCommand


def cli_commands() -> list[CliCommand]:
    return [
        CliCommand(
            ("leases", "list"),
            "list DHCP leases of the running node",
            "dhcp.leases",
            render=render_leases,
            arguments=((("--all",), {"action": "store_true", "help": "include ended leases"}),),
        )
    ]


def render_leases(leases: list[dict[str, Any]]) -> str:
    if not leases:
        return "no leases"
    rows = [("ADDRESS", "MAC", "STATE", "REMAINING", "HOSTNAME", "SUBNET")]
    rows += [
        (
            x["address"],
            x["mac"],
            x["state"],
            f"{x['remaining']}s",
            x["hostname"] or "-",
            x["subnet"],
        )
        for x in leases
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
