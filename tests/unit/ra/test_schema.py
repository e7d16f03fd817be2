"""The ``[ra]`` section: on by default in auto mode, on the DHCP server's interfaces
unless told others; errors name the file and key."""

from __future__ import annotations

import pytest

from appliance.config import validate
from appliance.errors import ConfigError
from plugins.dhcp.schema import SECTION as DHCP
from plugins.ra.schema import SECTION, interfaces


def load(document: dict):
    config = validate("rb.toml", document, [SECTION, DHCP], dev=False)
    return interfaces(config["ra"], config.sections.get("dhcp"), "rb.toml"), config["ra"]


def test_the_default_answers_in_auto_mode_on_the_dhcp_interfaces() -> None:
    chosen, ra = load({"dhcp": {"interfaces": ["eth1", "eth2"]}})
    assert chosen == ("eth1", "eth2")
    assert (ra.enabled, ra.mode, ra.listen, ra.router_hold) == (True, "auto", 2.0, 3600.0)


def test_interfaces_of_its_own_and_none_without_dhcp() -> None:
    assert load({"dhcp": {"interfaces": ["eth1"]}, "ra": {"interfaces": ["eth9"]}})[0] == ("eth9",)
    assert load({"dhcp": {"enabled": False, "interfaces": ["eth1"]}})[0] == ()
    assert interfaces(load({})[1], None, "rb.toml") == ()  # the dhcp plugin disabled


@pytest.mark.parametrize(
    ("ra", "match"),
    [
        (
            {"interfaces": ["eth1", "eth1"]},
            r"rb.toml: ra.interfaces\[1\]: expected each interface once",
        ),
        ({"mode": "off"}, r"rb.toml: ra.mode: expected one of 'auto', 'always'"),
        ({"listen": 120}, r"rb.toml: ra.listen: expected a number >= 0.0 and <= 60.0"),
        ({"interfaces": ["no spaces"]}, r"rb.toml: ra.interfaces\[0\]: expected an interface name"),
    ],
)
def test_errors_name_file_and_key(ra, match) -> None:
    with pytest.raises(ConfigError, match=match):
        load({"ra": ra})
