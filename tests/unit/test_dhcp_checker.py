"""The client-side checker of the HA tests: it must catch what it is for."""

from __future__ import annotations

from tests.support.dhcp_checker import double_bindings, lost_leases, parse


def answers(*lines: str):
    return parse(list(lines))


def test_an_address_given_to_a_second_machine_while_the_first_holds_it_is_caught():
    told = answers("ack 100.0 aa 10.0.0.5 20 10.0.0.200", "ack 110.0 bb 10.0.0.5 20 10.0.0.200")
    (problem,) = double_bindings(told)
    assert "10.0.0.5: bb acked at 110.000" in problem and "aa held it until 120.000" in problem


def test_reuse_after_expiry_a_nak_or_a_renewal_by_the_same_client_is_fine():
    assert not double_bindings(answers(
        "ack 100.0 aa 10.0.0.5 20 s", "ack 110.0 aa 10.0.0.5 20 s",  # renewed
        "ack 131.0 bb 10.0.0.5 20 s",  # after aa's lease ended (130)
        "ack 140.0 cc 10.0.0.6 20 s", "nak 145.0 cc 10.0.0.6 s", "ack 146.0 dd 10.0.0.6 20 s",
    ))  # fmt: skip
    assert double_bindings(answers("ack 100.0 aa 10.0.0.5 20 s", "ack 110.0 aa 10.0.0.5 20 s",
                                   "ack 129.0 bb 10.0.0.5 20 s"))  # the renewal counted


def test_an_acknowledged_lease_missing_or_shortened_on_the_server_is_caught():
    told = answers("ack 100.0 aa 10.0.0.5 60 s", "ack 100.0 bb 10.0.0.6 60 s",
                   "ack 100.0 cc 10.0.0.7 60 s", "ack 100.0 dd 10.0.0.8 5 s")
    leases = {"10.0.0.5": ("aa", 160.0), "10.0.0.6": ("xx", 160.0), "10.0.0.7": ("cc", 130.0)}
    problems = lost_leases(told, leases, at=110.0)
    assert len(problems) == 2  # bb's address held by another, cc's lease cut short; dd expired
    assert "bb" in problems[0] and "cc" in problems[1]
