"""The [ha] section: timing rules with clear errors, the witness rule, the quorum."""

from __future__ import annotations

import pytest

from appliance.config import validate
from appliance.errors import ConfigError
from appliance.ha.schema import SECTION, Timing, check_settings, check_timing, quorum


def settings(**ha):
    return validate("rack.toml", {"ha": ha}, [SECTION], dev=False)["ha"]


def test_the_defaults_are_valid():
    assert check_timing(Timing()) == Timing(1.0, 0.25, 0.15, 0.001)
    check_settings(settings(), "rack.toml")


def test_a_margin_below_the_clock_rate_error_names_the_key_and_the_bound():
    with pytest.raises(ConfigError) as err:
        check_settings(settings(lease=10.0, renew=1.0, margin=0.02, max_clock_rate_error=0.002),
                       "rack.toml")  # fmt: skip
    assert str(err.value).startswith("rack.toml: ha.margin: expected a margin >= 0.045 s")
    assert "max_clock_rate_error 0.002" in str(err.value)
    assert "found float 0.02" in str(err.value)


def test_a_renewal_that_does_not_fit_twice_is_refused():
    with pytest.raises(
        ConfigError,
        match=r"ha.renew: expected a renewal interval <= \(lease - margin\) / 2 = 0.425 s",
    ):
        check_settings(settings(renew=0.5), "rack.toml")


def test_a_margin_of_half_the_lease_is_refused():
    with pytest.raises(ConfigError, match="ha.margin: expected a margin < half the lease"):
        check_timing(Timing(lease=1.0, renew=0.1, margin=0.5))


def test_two_appliances_need_a_witness_or_the_named_opt_in():
    with pytest.raises(ConfigError) as err:
        check_settings(settings(peers=["bbbbbbbbbbbbbbbb@10.0.0.2:7471"]), "rack.toml")
    assert "ha.witnesses" in str(err.value) and "accept_split_brain_risk = true" in str(err.value)
    check_settings(
        settings(
            peers=["bbbbbbbbbbbbbbbb@10.0.0.2:7471"], witnesses=["cccccccccccccccc@10.0.9.1:7471"]
        ),
        "rack.toml",
    )
    check_settings(
        settings(peers=["bbbbbbbbbbbbbbbb@10.0.0.2:7471"], accept_split_brain_risk=True),
        "rack.toml",
    )


def test_an_acceptor_listed_twice_is_refused():
    with pytest.raises(ConfigError, match="each acceptor listed once"):
        check_settings(
            settings(peers=["dddddddddddddddd@a:1"], witnesses=["dddddddddddddddd@b:1"]),
            "rack.toml",
        )


def test_a_vip_needs_its_interface():
    with pytest.raises(ConfigError, match="ha.vip_interface: expected both"):
        check_settings(settings(vip="192.0.2.1/24"), "rack.toml")
    with pytest.raises(ConfigError, match="ha.vip: expected '' or an IPv4 address with prefix"):
        settings(vip="192.0.2.1")


@pytest.mark.parametrize(
    "acceptors, opt_in, expected", [(1, False, 1), (2, False, 2), (2, True, 1), (3, False, 2),
                                    (3, True, 2), (4, False, 3), (5, False, 3)],
)  # fmt: skip
def test_quorum_is_a_majority_except_for_the_opted_in_pair(acceptors, opt_in, expected):
    assert quorum(acceptors, opt_in) == expected


def test_a_peer_without_its_node_id_is_refused_with_the_form_expected():
    with pytest.raises(ConfigError, match=r"ha.peers\[0\]: expected 'NODE-ID@host:port'"):
        settings(peers=["10.0.0.2:7471"], witnesses=["cccccccccccccccc@10.0.9.1:7471"])
