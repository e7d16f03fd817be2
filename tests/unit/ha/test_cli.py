"""`rackboot ha ...` and `rackboot witness`: the requests the commands make, the rendering."""

from __future__ import annotations

import pytest

from appliance.cli import build_parser
from appliance.ha.plugin import CLI_COMMANDS, render_status


@pytest.mark.parametrize(
    "argv, control, sent",
    [
        (["ha", "status"], "ha.status", {}),
        (["ha", "promote"], "ha.promote", {"force": False}),
        (["ha", "promote", "--force"], "ha.promote", {"force": True}),
        (["ha", "demote"], "ha.demote", {}),
        (["ha", "handover"], "ha.handover", {"to": None}),
        (["ha", "handover", "--to", "fec995c4041f29fc"], "ha.handover", {"to": "fec995c4041f29fc"}),
        (["ha", "maintenance", "on"], "ha.maintenance", {"on": True}),
        (["ha", "maintenance", "off"], "ha.maintenance", {"on": False}),
    ],
)
def test_each_command_sends_its_control_request(argv, control, sent):
    args = build_parser(CLI_COMMANDS).parse_args(argv)
    assert args.plugin_command.control == control
    assert {dest: getattr(args, dest) for dest in args.plugin_args} == sent


def test_a_waiting_hand_over_says_whom_it_waits_for_and_why():
    text = render_status({
        "mode": "embedded", "role": "active", "epoch": 3, "valid_for": 0.61,
        "election": {"handover": {"to": "b1", "left": 9.5,
                                  "note": "hand-over to b1 waits: not caught up"}},
    })  # fmt: skip
    assert text.splitlines()[1:] == [
        "  maintenance off  holder seen -  known epoch None  quorum None/None  last refusal -",
        "  handing over to b1 (waits 9.5s more)",
        "  hand-over to b1 waits: not caught up",
    ]


def test_witness_takes_a_listen_address():
    args = build_parser().parse_args(["witness", "--listen", "10.0.0.9:7471"])
    assert args.listen == "10.0.0.9:7471"


def test_status_reads_like_a_sentence():
    text = render_status({
        "mode": "embedded", "role": "active", "epoch": 3, "valid_for": 0.61,
        "election": {"maintenance": False, "holder_seen": "abcd", "known_epoch": 3,
                     "quorum": 2, "acceptors": 3, "last_refusal": ""},
        "vip": {"address": "10.0.0.1/24", "interface": "eth1", "held": True},
        "last_change": "acquired epoch 3",
    })  # fmt: skip
    assert text.splitlines() == [
        "mode embedded  role active  epoch 3  valid for 0.610s",
        "  maintenance off  holder seen abcd  known epoch 3  quorum 2/3  last refusal -",
        "  vip 10.0.0.1/24 on eth1: held",
        "  last change: acquired epoch 3",
    ]


@pytest.mark.parametrize(
    "lease, shown",
    [
        (
            {"mode": "embedded", "role": "standby", "epoch": None, "valid_for": 0.0},
            "mode embedded  role standby  no lease held",
        ),
        (
            {"mode": "standalone", "role": "active", "epoch": 0, "valid_for": None},
            "mode standalone  role active  epoch 0  valid without end",
        ),
    ],
)
def test_status_says_when_no_lease_is_held_or_it_never_ends(lease, shown):
    """A standby used to read ``epoch None  valid for 0.000s``."""
    status = dict(lease)
    assert render_status(status).splitlines() == [shown]
