"""Admission (plugins/tftp/admission.py): per-source limits, waiting, fair eviction, no
amplification; pure, with explicit time."""

from __future__ import annotations

import pytest

from plugins.tftp.admission import ADMIT, MESSAGES, WAIT, Admission, Decision, Limits, refusal
from plugins.tftp.packets import Error, ErrorCode, Opcode, encode_request, parse_untrusted
from tests.unit.test_architecture import violations


def never(key) -> bool:
    return False


def key(source: str, port: int) -> tuple:
    return ((source, port), "10.0.0.1")


def ask(adm: Admission, source: str, port: int, now: float = 0.0, verified=never) -> Decision:
    k = key(source, port)
    return adm.request(k, source, now, ticket=k, verified=verified)


def test_one_source_holds_at_most_per_source_then_waits_then_is_refused():
    adm = Admission(Limits(per_source=4, wait_per_source=3))
    decisions = [ask(adm, "10.0.0.9", port) for port in range(1000, 1010)]
    assert decisions[:4] == [ADMIT] * 4
    assert decisions[4:7] == [WAIT] * 3
    assert [d.reason for d in decisions[7:]] == ["per_source"] * 3
    assert adm.running == 4 and adm.waiting == 3
    assert ask(adm, "10.0.0.10", 1000) == ADMIT  # another source is not held back


def test_a_flood_from_one_source_leaves_the_table_to_everyone_else():
    """The issue's flood: 500 requests from 500 ports of one address, never acknowledged."""
    adm = Admission(Limits())
    flood = [ask(adm, "10.0.0.66", 2000 + i, now=i * 0.004) for i in range(500)]
    assert flood.count(ADMIT) == 4 and flood.count(WAIT) == 64
    assert adm.running == 4
    for i in range(252):
        assert ask(adm, f"10.0.1.{i % 250 + 1}", 3000 + i, now=2.0) == ADMIT


def test_waiting_requests_start_in_arrival_order_as_their_source_frees_slots():
    adm = Admission(Limits(per_source=2))
    for port in (1, 2, 3, 4, 5):
        ask(adm, "a", port)
    ask(adm, "b", 1)
    assert adm.take_waiting(1.0, never) == ([], [])  # nothing ended yet
    adm.release(key("a", 1))
    assert adm.take_waiting(1.0, never) == ([key("a", 3)], [])
    adm.release(key("a", 2))
    adm.release(key("a", 3))
    assert adm.take_waiting(2.0, never) == ([key("a", 4), key("a", 5)], [])
    assert adm.waiting == 0 and adm.running == 3


def test_acknowledged_transfers_leave_room_for_the_next_request():
    """A host behind NAT (or 50 clients of a test rig): each transfer its clients have
    acknowledged no longer counts against the limit, so the rest start as fast as they
    answer; only a source that never answers is held to 4."""
    adm = Admission(Limits(per_source=4))
    verified: set = set()
    decisions = [ask(adm, "nat", port, verified=verified.__contains__) for port in range(6)]
    assert decisions == [ADMIT] * 4 + [WAIT] * 2
    verified.update({key("nat", 0), key("nat", 1)})
    assert adm.take_waiting(0.1, verified.__contains__) == ([key("nat", 4), key("nat", 5)], [])
    assert adm.running == 6
    assert ask(adm, "nat", 6, verified=verified.__contains__) == WAIT  # 4 unverified again


def test_waiting_requests_expire_after_max_wait():
    adm = Admission(Limits(per_source=1, max_wait=10.0))
    ask(adm, "a", 1, now=0.0)
    ask(adm, "a", 2, now=1.0)
    ask(adm, "a", 3, now=4.0)
    assert adm.get_timer(4.0) == 4.02  # look again soon: an ACK may free a place
    assert adm.get_timer(10.99) == 11.0
    assert adm.take_waiting(10.9, never) == ([], [])
    assert adm.take_waiting(11.0, never) == ([], [key("a", 2)])
    assert adm.get_timer(11.0) == 11.02
    adm.release(key("a", 1))
    assert adm.take_waiting(12.0, never) == ([key("a", 3)], [])
    assert adm.get_timer(12.0) is None


def test_the_wait_lists_are_bounded_in_total_too():
    adm = Admission(Limits(per_source=1, wait_per_source=10, wait_total=3))
    for source in "abcd":
        ask(adm, source, 1)
        ask(adm, source, 2)
    assert adm.waiting == 3
    assert ask(adm, "e", 1) == ADMIT  # under its own limit: no waiting involved
    assert ask(adm, "e", 2).reason == "per_source"


def test_a_full_table_evicts_the_unverified_transfer_of_the_source_holding_most():
    adm = Admission(Limits(max_transfers=6, per_source=4))
    for port in range(4):
        ask(adm, "big", port, now=port)
    ask(adm, "small", 1, now=5)
    ask(adm, "small", 2, now=6)
    verified = {key("big", 0)}.__contains__  # big's oldest made progress
    decision = ask(adm, "new", 1, now=7, verified=verified)
    assert decision == Decision("admit", evict=key("big", 1))  # oldest unverified of the richest
    assert key("big", 1) not in adm and key("new", 1) in adm and adm.running == 6


def test_a_verified_transfer_is_evicted_only_for_a_source_two_behind():
    adm = Admission(Limits(max_transfers=4, per_source=4))
    for port in range(2):
        ask(adm, "a", port)
        ask(adm, "b", port)
    always = lambda k: True  # noqa: E731
    # "c" holds 0 and a/b hold 2 each: taking a verified one is fairer (2 -> 1, 0 -> 1).
    assert ask(adm, "c", 1, verified=always) == Decision("admit", evict=key("a", 0))
    # now a:1 b:2 c:1; "c" again holds 1, b holds 2: only one more, so no verified eviction.
    assert ask(adm, "c", 2, verified=always).reason == "busy"
    assert ask(adm, "d", 1, verified=always) == Decision("admit", evict=key("b", 0))


def test_spoofed_sources_cannot_lock_a_real_client_out():
    """Every slot held by a different forged address, one each, never acknowledged: a
    real client still gets in, and then stays while forged requests keep coming."""
    adm = Admission(Limits(max_transfers=256))
    for i in range(256):
        ask(adm, f"spoof{i}", 1, now=i * 0.001)
    verified: set = set()
    assert ask(adm, "pxe", 1, now=1.0, verified=verified.__contains__).evict == key("spoof0", 1)
    verified.add(key("pxe", 1))  # its first ACK came back
    for i in range(256, 1256):
        decision = ask(adm, f"spoof{i}", 1, now=1.0 + i * 0.001, verified=verified.__contains__)
        assert decision.evict != key("pxe", 1)
    assert key("pxe", 1) in adm


def test_a_source_equal_to_all_others_is_refused_without_churn():
    adm = Admission(Limits(max_transfers=2, per_source=4))
    ask(adm, "a", 1)
    ask(adm, "b", 1)
    assert ask(adm, "a", 2, verified=lambda k: False).reason == "busy"  # a holds 1, b 1


def test_release_of_an_unknown_key_changes_nothing():
    adm = Admission(Limits())
    ask(adm, "a", 1)
    adm.release(key("a", 2))
    assert adm.running == 1


@pytest.mark.parametrize("reason", ["per_source", "busy", "wait_expired"])
@pytest.mark.parametrize("name", ["a", "pxelinux.0", "x" * 300])
def test_a_refusal_is_never_longer_than_the_request(reason, name):
    request = encode_request(Opcode.RRQ, name, "octet", {})
    answer = refusal(reason, len(request))
    assert len(answer) <= len(request)
    parsed = parse_untrusted(answer)
    assert isinstance(parsed, Error) and parsed.code == ErrorCode.NOT_DEFINED
    assert parsed.message and MESSAGES[reason].startswith(parsed.message)


def test_admission_is_sans_io():
    # Until tests/unit/test_architecture.py lists it in SANS_IO, checked here by its rule.
    assert violations("plugins.tftp.admission") == []


def test_a_request_expires_at_the_very_instant_get_timer_names():
    # 10.1 - 0.1 < 10.0 in floating point: compared that way, a shell woken at the
    # deadline would find nothing due and wake again at once, for ever on a mock clock.
    adm = Admission(Limits(per_source=1, max_wait=10.0))
    ask(adm, "a", 1, now=0.1)
    ask(adm, "a", 2, now=0.1)
    deadline = adm.get_timer(20.0)
    assert adm.take_waiting(deadline, never) == ([], [key("a", 2)])
