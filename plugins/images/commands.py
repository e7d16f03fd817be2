"""``rackboot image add|list|show|verify|rm|gc``: the command line of the images plugin."""

from __future__ import annotations

import os

from appliance.api import CliCommand

from .render import render_added, render_list, render_removed, render_show, render_verified


def cli_commands() -> list[CliCommand]:
    """``rackboot image ...``: each a request to the running node's images service."""
    version = (("--version",), {"help": "a version (default: the current one)"})
    return [
        CliCommand(
            ("image", "add"),
            "add a file to the image store as a new version",
            "images.add",
            render_added,
            timeout=3600.0,
            arguments=(
                (("name",), {"help": "image name"}),
                (("file",), {"type": _absolute, "help": "the file to add"}),
                (("--version",), {"help": "version (default: the next integer)"}),
            ),
        ),
        CliCommand(("image", "list"), "list the images of the store", "images.list", render_list),
        CliCommand(
            ("image", "show"),
            "show an image version's head and chunks",
            "images.show",
            render_show,
            arguments=(
                (("name",), {"help": "image name"}),
                version,
                (("--chunks",), {"action": "store_true", "help": "list every chunk"}),
            ),
        ),
        CliCommand(
            ("image", "verify"),
            "read an image version whole against its signed head",
            "images.verify",
            render_verified,
            timeout=3600.0,
            arguments=((("name",), {"help": "image name"}), version),
        ),
        CliCommand(
            ("image", "rm"),
            "remove an image version",
            "images.rm",
            render_removed,
            arguments=(
                (("name",), {"help": "image name"}),
                (("--version",), {"required": True, "help": "the version"}),
            ),
        ),
        CliCommand(
            ("image", "gc"),
            "remove old versions and unreferenced files",
            "images.gc",
            render_removed,
            timeout=600.0,
            arguments=((("--keep",), {"type": int, "help": "versions kept per image"}),),
        ),
    ]


def _absolute(path: str) -> str:
    return os.path.abspath(path)  # the node runs elsewhere: the CLI's cwd means nothing there
