"""The A/B slot machine: entry names, the boot loader's choice, and updates cut by
power losses at any point, then booted with any health results."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.firmware import slots
from appliance.firmware.slots import (
    Entry,
    MarkBad,
    Promote,
    Reboot,
    SlotError,
    VerifySlot,
    WriteSlot,
    after_boot,
    boot,
    boot_order,
    entry_name,
    must_reboot,
    parse_entry_name_untrusted,
    plan_update,
)

FACTORY = {"a": Entry(2), "b": Entry(1)}  # image/ flashes both slots alike, A preferred


def test_entry_names_round_trip_and_strangers_are_refused():
    for entry in (Entry(7), Entry(7, 3, 0), Entry(12, 0, 3), Entry(1, 1, 2)):
        for slot in "ab":
            assert parse_entry_name_untrusted(entry_name(slot, entry)) == (slot, entry)
    assert entry_name("b", Entry(7, 2, 1)) == "rackboot-7-b+2-1.conf"
    for name in ("rackboot-a.conf", "rackboot-1-c.conf", "rackboot-1-a+x.conf", "other.conf",
                 "rackboot-1-a.conf.tmp", "rackboot-1234567890-a.conf"):  # fmt: skip
        with pytest.raises(SlotError, match="is not a rackboot-GENERATION"):
            parse_entry_name_untrusted(name)


def test_the_loader_prefers_a_newer_generation_unless_it_is_bad():
    assert boot_order({"a": Entry(2), "b": Entry(3, 3, 0)}) == ["b", "a"]
    assert boot_order({"a": Entry(2), "b": Entry(3, 0, 3)}) == ["a", "b"]
    assert boot_order({"a": Entry(4, 0), "b": Entry(3, 0)}) == ["a", "b"]  # both bad: the newer
    state, slot = boot({"a": Entry(2), "b": Entry(3, 3, 0)})
    assert (slot, state["b"]) == ("b", Entry(3, 2, 1))  # a try counted
    state, slot = boot({"a": Entry(2), "b": Entry(3, 0, 3)})
    assert (slot, state) == ("a", {"a": Entry(2), "b": Entry(3, 0, 3)})  # a good entry: no count


def test_an_update_goes_to_the_other_slot_and_only_from_a_good_one():
    assert plan_update(FACTORY, "a", "1.1") == [
        MarkBad("b"), WriteSlot("b"), VerifySlot("b", "1.1"), Promote("b"), Reboot()]  # fmt: skip
    with pytest.raises(SlotError, match="slot b is not marked good yet"):
        plan_update({"a": Entry(2), "b": Entry(3, 2, 1)}, "b", "1.2")
    promoted = slots.apply(slots.apply(FACTORY, MarkBad("b")), Promote("b"))
    assert promoted["b"] == Entry(3, slots.TRIES, 0)


def test_health_judges_only_a_slot_on_trial():
    trial = {"a": Entry(2), "b": Entry(3, 2, 1)}
    assert after_boot(trial, "b", True)["b"] == Entry(3)
    failed = after_boot(trial, "b", False)
    assert failed["b"].bad and must_reboot(failed, "b") and boot(failed)[1] == "a"
    assert after_boot(FACTORY, "a", False) == FACTORY  # the last good slot is never given up
    assert not must_reboot(FACTORY, "a")


# -- the property: power cut anywhere, any health results -----------------------

INTACT = "intact"


@dataclass
class Appliance:
    """The ESP's entries and what each partition really holds."""

    esp: dict[str, Entry]
    judge: object = after_boot  # what the booted system does with its health result
    content: dict[str, str] = field(default_factory=lambda: {"a": INTACT, "b": INTACT})
    booted: str | None = None

    def check(self) -> None:
        for slot, entry in self.esp.items():
            if entry.good:
                assert self.content[slot] == INTACT, f"good slot {slot} holds {self.content[slot]}"
        assert any(e.good for e in self.esp.values()), f"no good slot left: {self.esp}"

    def power_on(self, health: list[bool]) -> None:
        """Boot, run the health check, reboot while it says so (bounded)."""
        for ok in health:
            self.esp, self.booted = boot(self.esp)
            assert self.content[self.booted] == INTACT, (
                f"booted slot {self.booted} holding {self.content[self.booted]}: {self.esp}"
            )
            self.esp = self.judge(self.esp, self.booted, ok)
            self.check()
            if not must_reboot(self.esp, self.booted):
                return

    def update(self, planner, cut: int, corrupt: bool) -> None:
        """Carry out the plan's steps until the power is cut before step ``cut``."""
        for index, step in enumerate(planner(self.esp, self.booted, "2.0")):
            if index == cut:
                if isinstance(step, WriteSlot):
                    self.content[step.slot] = "partial"  # cut in the middle of the write
                return
            match step:
                case WriteSlot(slot):
                    self.content[slot] = "corrupt" if corrupt else "unverified"
                case VerifySlot(slot):
                    if self.content[slot] != "unverified":
                        return  # the writer refuses: the update stops here
                    self.content[slot] = INTACT
                case Reboot():
                    return
                case _:
                    self.esp = slots.apply(self.esp, step)
            self.check()


rounds = st.lists(
    st.tuples(
        st.integers(0, 6),  # the step before which the power is cut (6: none)
        st.booleans(),  # the write goes wrong
        st.lists(st.booleans(), min_size=1, max_size=slots.TRIES + 2),  # health per boot
    ),
    min_size=1,
    max_size=5,
)


def survives_updates(planner=plan_update, judge=after_boot):
    @settings(max_examples=300, derandomize=True, database=None)
    @given(rounds)
    def run(plan_rounds):
        box = Appliance(dict(FACTORY), judge)
        box.power_on([True])
        for cut, corrupt, health in plan_rounds:
            if box.esp[box.booted].good:
                box.update(planner, cut, corrupt)
            box.power_on(health)
        box.power_on([True] * (slots.TRIES + 2))  # left alone, it settles on a good slot
        assert box.esp[box.booted].good and box.content[box.booted] == INTACT

    return run


def test_any_cut_update_and_any_health_leave_a_good_intact_slot():
    survives_updates()()


def _reordered(order):
    def planner(state, booted, version):
        steps = plan_update(state, booted, version)
        return [steps[i] for i in order]

    return planner


@pytest.mark.parametrize(
    "planner",
    [
        _reordered([0, 1, 3, 2, 4]),  # promoted before verified
        _reordered([0, 3, 1, 2, 4]),  # promoted before written
        _reordered([1, 2, 3, 4]),  # written without being marked bad first
    ],
    ids=["promote-before-verify", "promote-before-write", "no-mark-bad"],
)
def test_a_planted_defect_in_the_plan_is_found(planner):
    with pytest.raises(AssertionError):
        survives_updates(planner)()


def test_a_planted_defect_in_the_health_judgement_is_found():
    def distrusts_good_slots(state, booted, ok):
        if ok:
            return after_boot(state, booted, ok)
        return {**state, booted: Entry(state[booted].generation, 0, 0)}

    with pytest.raises(AssertionError):
        survives_updates(judge=distrusts_good_slots)()
