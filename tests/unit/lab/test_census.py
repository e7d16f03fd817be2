"""rackboot lab's judgement of the namespaces and records it finds (appliance/lab/census.py)."""

from __future__ import annotations

from appliance.lab import census


def test_names_of_a_lab_carry_its_id_and_others_are_not_ours() -> None:
    assert census.lab_of("rblab0a1b2c-br") == "0a1b2c"
    assert census.lab_of("rblab0a1b2c-vm") == "0a1b2c"
    # the tests' labs (prefix rbt), a guess at our prefix with a short id, anyone else's
    for name in ("rbt0a1b2c-br", "rblab0a1b-br", "rblab0a1b2cd-br", "rblabXYZXYZ-a", "netns1"):
        assert census.lab_of(name) is None, name
    assert census.by_lab(["rblab000001-b", "x", "rblab000001-a", "rblab000002-br"]) == {
        "000001": ["rblab000001-a", "rblab000001-b"],
        "000002": ["rblab000002-br"],
    }


def test_stale_labs_are_removed_running_ones_kept_and_unowned_namespaces_refused() -> None:
    found = ["rblab00000a-br", "rblab00000a-a", "rblab00000b-br", "rblab00000c-br", "other"]
    records = {"00000a": False, "00000b": True, "00000d": False}
    verdict = census.judge(found, records)
    assert verdict.stale == {"00000a": ["rblab00000a-a", "rblab00000a-br"], "00000d": []}
    assert verdict.running == {"00000b": ["rblab00000b-br"]}
    assert verdict.unowned == {"00000c": ["rblab00000c-br"]}
    refusal = verdict.refusal()
    assert "rblab00000c-br" in refusal and "ip netns del" in refusal
    assert "rblab00000a" not in refusal and "rblab00000b" not in refusal


def test_nothing_found_nothing_to_do() -> None:
    verdict = census.judge(["foo"], {})
    assert (verdict.stale, verdict.running, verdict.unowned, verdict.refusal()) == ({}, {}, {}, "")
