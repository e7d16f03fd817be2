"""What rackboot lab shows (appliance/lab/view.py) and how (appliance/lab/screen.py)."""

from __future__ import annotations

import io

from appliance.lab import view
from appliance.lab.screen import ERASE_UP, Screen

NAMES = {"id-a": "a", "id-b": "b", "id-w": "w"}


def squeezed(line: str) -> str:
    """The words of a line, single-spaced (the columns' padding left out)."""
    return " ".join(line.split())


def status(role: str, epoch: int | None, lsn: int, held: bool, replication: dict,
           heard: dict | None = None) -> dict:  # fmt: skip
    return {"core": {
        "role": role,
        "ha": {"role": role, "epoch": epoch, "election": {"known_epoch": 4},
               "vip": {"held": held}, "transport": {"heard": heard or {}}},
        "state": {"lsn": lsn, "replication": replication},
    }}  # fmt: skip


ACTIVE = status("active", 5, 42, True,
                {"followers": {"id-b": {"stage": "stream", "lag": 3, "counted": True}}},
                heard={"id-w": 0.25})  # fmt: skip
STANDBY = status("standby", None, 39, False, {"following": {"leader": "id-a", "stage": "stream"}},
                 heard={"id-w": 1.5})  # fmt: skip


def test_each_appliance_in_one_line_with_role_epoch_log_vip_and_replication() -> None:
    line = view.appliance_line(view.Appliance("a", ACTIVE), NAMES)
    assert squeezed(line) == "a active epoch 5 log 42 VIP streams to b stream lag 3"
    line = view.appliance_line(view.Appliance("b", STANDBY), NAMES)
    # a standby holds no lease: the epoch it knows
    assert squeezed(line) == "b standby epoch 4 log 39 follows a (stream)"
    alone = status("standby", None, 0, False, {"followers": {"x": {"stage": "catch-up", "lag": 9,
                                                                  "counted": False}}})  # fmt: skip
    assert view.appliance_line(view.Appliance("a", alone), NAMES).endswith(
        "streams to x catch-up lag 9 (not counted)"
    )
    assert view.appliance_line(view.Appliance("a", status("active", 1, 0, False, {})), NAMES)\
        .endswith("no replication")  # fmt: skip
    assert view.appliance_line(view.Appliance("b", None, "killed (SIGKILL)"), NAMES) == (
        "b  killed (SIGKILL)"
    )


def test_the_witness_as_heard_by_each_appliance_that_answers() -> None:
    appliances = [view.Appliance("a", ACTIVE), view.Appliance("b", None, "killed")]
    assert view.witness_line("w", "id-w", appliances) == "w  witness  heard by a 0.25 s ago"
    assert view.witness_line("w", "id-x", appliances) == "w  witness  heard by nobody"


def test_the_machine_by_its_record() -> None:
    record = {"state": "kernel", "since": 100.0, "attempt": 1}
    assert squeezed(view.machine_line("vm1", record, 102.5)) == "vm1 kernel for 2.5 s, retry 1"
    assert "no record" in view.machine_line("vm1", None, 0.0)


def test_the_block_is_printed_again_for_a_new_role_not_for_a_moving_log() -> None:
    later = status("active", 5, 50, True,
                   {"followers": {"id-b": {"stage": "stream", "lag": 0, "counted": True}}})  # fmt: skip
    same = view.appliance_key(view.Appliance("a", ACTIVE))
    assert view.appliance_key(view.Appliance("a", later)) == same
    demoted = status("standby", None, 50, False, {"following": {"leader": "id-b"}})
    assert view.appliance_key(view.Appliance("a", demoted)) != same
    assert view.appliance_key(view.Appliance("a", None, "killed")) != same


def test_boot_timings_come_from_the_records_history_after_the_request() -> None:
    history = [
        (90.0, "provisioned", "the boot before"),
        (100.0, "requested", "reprovision"),
        (102.5, "discovered", "lease"),
        (102.6, "loader", "script"),
        (104.0, "kernel", "kernel"),
        (104.5, "kernel", "an initrd again"),
        (110.25, "provisioned", "installed"),
    ]
    stages = view.stage_times(history, 100.0)
    assert [(state, round(t, 3)) for state, t in stages] == [
        ("requested", 0.0), ("discovered", 2.5), ("loader", 2.6), ("kernel", 4.0),
        ("provisioned", 10.25),
    ]  # fmt: skip
    assert view.timings_text(stages[-2:]) == "kernel 4.0 s, provisioned 10.2 s"
    assert view.stage_times(history, 111.0) == []


def test_a_terminal_gets_the_block_redrawn_in_place_a_log_gets_changes_only() -> None:
    out = io.StringIO()
    screen = Screen(out, live=False)
    screen.show(["rack", "  a active"], key=1)
    screen.show(["rack", "  a active"], key=1)  # same key: not again
    screen.say("step")
    screen.show(["rack", "  a standby"], key=2)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["rack", "  a active"] and lines[2].endswith("] step")
    assert lines[3:] == ["rack", "  a standby"]
    assert "\x1b" not in out.getvalue()

    out = io.StringIO()
    screen = Screen(out, live=True)
    screen.show(["rack", "  a active"], key=1)
    screen.say("step")  # above the block: the block erased, the step, the block again
    screen.freeze()
    screen.say("after")  # the block stays, no longer redrawn
    text = out.getvalue()
    erase = ERASE_UP.format(n=2)
    assert text.count(erase) == 1
    before, after = text.split(erase)
    assert before == "rack\n  a active\n"
    assert after.split("\n")[1:3] == ["rack", "  a active"] and after.rstrip().endswith("after")
