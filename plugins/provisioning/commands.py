"""``rackboot machines list|show|reprovision|pool``: the command line of the
provisioning plugin (declared in the ``rackboot.cli`` entry points: the CLI imports
this module alone to run it)."""

from __future__ import annotations

from appliance.api import CliCommand

from .render import render_list, render_show


def cli_commands() -> list[CliCommand]:
    name = (("name",), {"help": "machine name"})
    return [
        CliCommand(
            ("machines", "list"),
            "list the machines and their stages",
            "machines.list",
            render_list,
        ),  # fmt: skip
        CliCommand(
            ("machines", "show"),
            "show a machine's record and history",
            "machines.show",
            render_show,
            arguments=(name,),
        ),  # fmt: skip
        CliCommand(
            ("machines", "reprovision"),
            "provision a machine (again)",
            "machines.reprovision",
            render_show,
            arguments=(name, (("--profile",), {"help": "another boot profile"})),
        ),  # fmt: skip
        CliCommand(
            ("machines", "pool"),
            "put a machine in a pool of spares",
            "machines.pool",
            render_show,
            arguments=(
                name,
                (("pool",), {"help": "pool name ('' for none)"}),
                (("--spare",), {"action": "store_true", "help": "an idle spare of the pool"}),
            ),
        ),  # fmt: skip
    ]
