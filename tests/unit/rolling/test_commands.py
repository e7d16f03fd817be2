"""`rackboot firmware roll`: the command line and what it prints while it follows a roll."""

from __future__ import annotations

from appliance.cli import build_parser
from appliance.rolling.commands import cmd_roll, render
from tests.unit.rolling.test_plan import back, roll_of, step


def test_the_roll_command_sits_under_firmware_beside_its_own_commands():
    args = build_parser().parse_args(["firmware", "roll", "2.0.bundle", "--timeout", "60"])
    assert args.func is cmd_roll and args.bundle == "2.0.bundle" and args.timeout == 60.0
    args = build_parser().parse_args(["firmware", "roll", "--json"])
    assert args.bundle is None and args.json
    assert build_parser().parse_args(["firmware", "status"]).func is not cmd_roll


def test_the_progress_names_each_appliance_and_marks_the_one_being_updated():
    roll, _ = step(roll_of("a", "b"), "a", {"b": back("1.0")}, 1.0)
    status = {"firmware": {"version": "1.0", "trial": False}, "busy": "",
              "roll": roll.record()}  # fmt: skip
    assert render(status).splitlines() == [
        "this appliance: version 1.0",
        "roll r1 to 2.0: running",
        " > b: applying from 1.0",
        "   a: pending from 1.0",
    ]


def test_without_a_roll_it_says_so():
    status = {"firmware": {"version": "", "trial": False}, "busy": "", "roll": None}
    assert render(status).splitlines() == ["this appliance: version -", "no roll"]
