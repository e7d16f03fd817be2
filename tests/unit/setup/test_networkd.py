"""[network] and the systemd-networkd files made from it (appliance/setup/networkd.py): each
interface's address with its subnet's prefix, the management address and gateway, one
file for an interface that is both, the other wired interfaces left alone; the section's
cross-key refusals."""

from __future__ import annotations

import configparser

import pytest

from appliance.errors import ConfigError
from appliance.schema import validate_table
from appliance.setup import questions as q
from appliance.setup.checks import Interface
from appliance.setup.networkd import NETWORK, UNCONFIGURED, check, files

from .test_questions import FIRST, scripted

IFACES = [Interface(n, "up", "-") for n in ("eth0", "eth1", "eth2")]
SOURCE = "/etc/rackboot/rackboot.toml"


def network_of(answers: dict[str, str]):
    """[network] as setup writes it for ``answers``, validated as the node reads it."""
    doc = q.apply({}, q.collect(scripted(answers)[0], q.Current(), IFACES, enrolled=False, now=0))
    return validate_table(NETWORK.fields, doc["network"], SOURCE, "network", dev=False)


def parsed(text: str) -> dict[str, dict[str, list[str]]]:
    """A .network file: section -> key -> values (a key may repeat, as Address= does)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key, []).append(value)
    return out


def test_management_and_each_provisioning_interface_get_their_addresses():
    two = {**FIRST, "interfaces": "eth1, eth2", "subnets.eth2.network": "10.2.0.0/23",
           "subnets.eth2.address": "10.2.1.9", "subnets.eth2.pools": "10.2.0.10-10.2.0.99",
           "subnets.eth2.router": "none"}  # fmt: skip
    made = files(network_of(two), SOURCE)
    assert sorted(made) == ["10-rackboot-eth0.network", "10-rackboot-eth1.network",
                            "10-rackboot-eth2.network", UNCONFIGURED]  # fmt: skip
    mgmt, eth1, eth2 = (parsed(made[f"10-rackboot-{n}.network"]) for n in ("eth0", "eth1", "eth2"))
    assert mgmt["Match"] == {"Name": ["eth0"]}
    assert mgmt["Network"]["Address"] == ["10.0.0.5/24"]
    assert mgmt["Network"]["Gateway"] == ["10.0.0.1"]
    assert "KeepConfiguration" not in mgmt["Network"]
    assert eth1["Match"] == {"Name": ["eth1"]}
    assert eth1["Network"]["Address"] == ["10.1.0.5/24"]  # the prefix of its subnet
    assert eth2["Network"]["Address"] == ["10.2.1.9/23"]
    for link in (eth1, eth2):
        assert "Gateway" not in link["Network"]  # one default route, the management one
        assert link["Network"]["KeepConfiguration"] == ["static"]  # the VIP survives a reload
        assert link["Network"]["IPv6AcceptRA"] == ["no"]
    for link in (mgmt, eth1, eth2):
        assert link["Network"]["DHCP"] == ["no"]
        assert link["Network"]["ConfigureWithoutCarrier"] == ["yes"]
        assert link["Link"]["RequiredForOnline"] == ["no-carrier"]
    assert SOURCE in made["10-rackboot-eth1.network"].splitlines()[0]
    rest = parsed(made[UNCONFIGURED])
    assert rest == {"Match": {"Name": ["en* eth*"]}, "Link": {"Unmanaged": ["yes"]}}


def test_no_gateway_no_default_route():
    made = files(network_of({**FIRST, "management_gateway": "none"}), SOURCE)
    assert "Gateway" not in parsed(made["10-rackboot-eth0.network"])["Network"]


def test_one_interface_for_both_carries_both_addresses_in_one_file():
    shared = {**FIRST, "management_interface": "eth1", "management_address": "10.9.0.5/24",
              "management_gateway": "10.9.0.1"}  # fmt: skip
    made = files(network_of(shared), SOURCE)
    assert sorted(made) == ["10-rackboot-eth1.network", UNCONFIGURED]
    eth1 = parsed(made["10-rackboot-eth1.network"])["Network"]
    assert eth1["Address"] == ["10.9.0.5/24", "10.1.0.5/24"]
    assert eth1["Gateway"] == ["10.9.0.1"] and eth1["KeepConfiguration"] == ["static"]
    same = {**shared, "management_address": "10.1.0.5/24", "management_gateway": "10.1.0.1",
            "subnets.eth1.router": "none"}  # fmt: skip
    eth1 = parsed(files(network_of(same), SOURCE)["10-rackboot-eth1.network"])["Network"]
    assert eth1["Address"] == ["10.1.0.5/24"]  # the same address once


def test_files_parse_as_systemd_ini():
    """systemd's unit syntax is ini-like: every line is a section, a comment or key=value."""
    for text in files(network_of(FIRST), SOURCE).values():
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read_string(text)
        assert parser.sections()


def test_an_unset_section_makes_no_files():
    unset = validate_table(NETWORK.fields, {}, SOURCE, "network", dev=False)
    assert files(unset, SOURCE) == {}
    check(unset, SOURCE)


@pytest.mark.parametrize(
    ("table", "key", "expected"),
    [
        ({"management_interface": "eth0"}, "network.management_address", "an address with"),
        ({"management_address": "10.0.0.5/24"}, "network.management_interface", "the interface"),
        ({"management_interface": "eth0", "management_address": "10.0.0.5/24",
          "management_gateway": "10.0.1.1"}, "network.management_gateway", "an address of 10.0.0.0/24"),
        ({"management_interface": "eth0", "management_address": "10.0.0.5/24",
          "management_gateway": "10.0.0.5"}, "network.management_gateway", "other than"),
        ({"provisioning": [{"interface": "eth1", "address": "10.1.0.5/24"},
                           {"interface": "eth1", "address": "10.2.0.5/24"}]},
         "network.provisioning[1].interface", "each interface once"),
    ],
)  # fmt: skip
def test_refusals_name_the_key(table, key, expected):
    network = validate_table(NETWORK.fields, table, SOURCE, "network", dev=False)
    with pytest.raises(ConfigError) as caught:
        check(network, SOURCE)
    assert caught.value.keypath == key and expected in caught.value.expected


def test_kinds_refuse_an_address_without_its_prefix():
    with pytest.raises(ConfigError, match="network.management_address: expected an IPv4 address "
                       "with its prefix length"):  # fmt: skip
        validate_table(NETWORK.fields, {"management_address": "10.0.0.5"}, SOURCE, "network", False)
