"""The setup dialog's validators, its questions in order, and how answers edit a document
(appliance/setup/questions.py: pure, no terminal)."""

from __future__ import annotations

import time
from ipaddress import IPv4Address as A
from ipaddress import IPv4Network as N

import pytest

from appliance.cluster.jointoken import Token
from appliance.setup import questions as q
from appliance.setup.questions import Interface, Invalid, Provisioning

NET = N("10.1.0.0/24")
SUBNET = Provisioning("eth1", NET, ((A("10.1.0.100"), A("10.1.0.199")),), A("10.1.0.1"))
IFACES = [Interface("eth0", "up", "52:54:00:00:00:01"), Interface("eth1", "down", "-")]


def refused(check, text, *args) -> str:
    with pytest.raises(Invalid) as caught:
        check(text, *args)
    return caught.value.expected


def test_names_follow_the_configuration_pattern():
    assert q.check_name("rb-a.1_x") == "rb-a.1_x"
    for bad in ("", "-a", "a b", "x" * 64, "é"):
        assert "letters, digits" in refused(q.check_name, bad)
    assert "rack name" in refused(q.check_name, "r/1", "rack name")


def test_addresses_are_unicast_ipv4():
    assert q.check_address("10.0.0.5") == A("10.0.0.5")
    assert "IPv4 address such as" in refused(q.check_address, "10.0.0")
    for bad in ("0.0.0.0", "127.0.0.1", "224.0.0.1", "255.255.255.255"):
        assert "unicast" in refused(q.check_address, bad)


def test_subnets_need_cidr_syntax_and_their_network_address():
    assert q.check_network("10.1.0.0/24") == NET
    assert "CIDR" in refused(q.check_network, "10.1.0.0")
    assert "CIDR" in refused(q.check_network, "10.1.0.0/33")
    assert "host bits set" in refused(q.check_network, "10.1.0.5/24")
    assert "10.1.0.0/24" in refused(q.check_network, "10.1.0.5/24")
    assert "/30" in refused(q.check_network, "10.1.0.0/31")


def test_interfaces_must_exist_once():
    assert q.check_interfaces("eth0, eth1", IFACES) == ("eth0", "eth1")
    assert q.check_interfaces("eth1", IFACES) == ("eth1",)
    assert "no 'eth9'" in refused(q.check_interfaces, "eth0 eth9", IFACES)
    assert "eth0, eth1" in refused(q.check_interfaces, " , ", IFACES)
    assert "once" in refused(q.check_interfaces, "eth0,eth0", IFACES)


def test_pools_inside_their_subnet_apart_and_clear_of_our_addresses():
    two = q.check_pools("10.1.0.150-10.1.0.160, 10.1.0.10-10.1.0.20", NET)
    assert two == ((A("10.1.0.10"), A("10.1.0.20")), (A("10.1.0.150"), A("10.1.0.160")))
    assert "first-last" in refused(q.check_pools, "10.1.0.10", NET)
    assert "first <= last" in refused(q.check_pools, "10.1.0.20-10.1.0.10", NET)
    assert "(10.1.1.5 is not)" in refused(q.check_pools, "10.1.0.10-10.1.1.5", NET)
    assert "broadcast" in refused(q.check_pools, "10.1.0.10-10.1.0.255", NET)
    assert "broadcast" in refused(q.check_pools, "10.1.0.0-10.1.0.10", NET)
    assert "overlap" in refused(q.check_pools, "10.1.0.10-10.1.0.20,10.1.0.20-10.1.0.30", NET)
    assert "10.1.0.15" in refused(q.check_pools, "10.1.0.10-10.1.0.20", NET, [A("10.1.0.15")])


def test_router_inside_its_subnet_and_outside_the_pools():
    assert q.check_router("10.1.0.1", SUBNET) == A("10.1.0.1")
    assert q.check_router("none", SUBNET) is None
    assert "(10.2.0.1 is not)" in refused(q.check_router, "10.2.0.1", SUBNET)
    assert "outside the pools" in refused(q.check_router, "10.1.0.100", SUBNET)
    assert "'none'" in refused(q.check_router, "router", SUBNET)


def test_vip_in_a_provisioning_subnet_outside_pools_and_taken_addresses():
    mgmt = A("10.1.0.5")
    assert q.check_vip("10.1.0.2", [SUBNET], mgmt) == A("10.1.0.2")
    assert q.check_vip("none", [SUBNET], mgmt) is None
    assert "inside a provisioning subnet (10.1.0.0/24)" in refused(
        q.check_vip, "10.9.0.2", [SUBNET], mgmt
    )
    assert "outside the pools" in refused(q.check_vip, "10.1.0.199", [SUBNET], mgmt)
    assert "outside the pools" in refused(q.check_vip, "10.1.0.100", [SUBNET], mgmt)
    assert "broadcast" in refused(q.check_vip, "10.1.0.255", [SUBNET], mgmt)
    assert "of its own" in refused(q.check_vip, "10.1.0.1", [SUBNET], mgmt)
    assert "of its own" in refused(q.check_vip, "10.1.0.5", [SUBNET], mgmt)


def test_cluster_choice_and_token():
    assert q.check_cluster_choice("NEW", False) == "new"
    assert q.check_cluster_choice("join", False) == "join"
    assert "'new'" in refused(q.check_cluster_choice, "keep", False)
    assert q.check_cluster_choice("keep", True) == "keep"
    assert "already belongs" in refused(q.check_cluster_choice, "new", True)
    now = time.time()
    token = Token("0123456789abcdef", b"\1" * 32, b"\2" * 8, b"\3" * 16, int(now) + 600,
                  ("10.0.0.5:7470",)).encode()  # fmt: skip
    wrapped = token[:40] + "\n  " + token[40:]
    assert q.check_token(wrapped, now) == token
    assert "start with 'rbj1.'" in refused(q.check_token, "hello", now)
    assert "checksum" in refused(q.check_token, token[:-3] + "AAA", now)
    assert "expired" in refused(q.check_token, token, now + 3600)


def scripted(answers: dict[str, str]):
    """An ``ask`` that answers by key, recording the questions and their defaults."""
    asked = {}

    def ask(question):
        key = ".".join(question.key)
        asked[key] = question.default
        return question.check(answers.get(key) or question.default)

    return ask, asked


FIRST = {
    "name": "rb-a", "rack": "r12", "management_address": "10.0.0.5", "interfaces": "eth1",
    "subnets.eth1.network": "10.1.0.0/24", "subnets.eth1.pools": "10.1.0.100-10.1.0.199",
    "subnets.eth1.router": "10.1.0.1", "vip": "10.1.0.2",
}  # fmt: skip


def test_answers_make_the_document_and_keep_what_is_not_asked():
    kept = {
        "node": {"data_dir": "/srv/rb", "shutdown_grace": 2.5},
        "tftp": {"root": "/srv/tftp"},
        "dhcp": {"lease_time": 600, "subnets": [
            {"network": "10.1.0.0/24", "interface": "eth1", "dns": ["10.1.0.53"],
             "router": "10.1.0.254", "pools": ["10.1.0.10-10.1.0.20"]},
            {"network": "10.7.0.0/24", "interface": "eth0", "pools": []},
            {"network": "10.8.0.0/24"},
        ]},
        "ha": {"lease": 2.0, "margin": 0.2},
        "cluster": {"port": 7500},
    }  # fmt: skip
    ask, _ = scripted(FIRST)
    answers = q.collect(ask, q.Current.of(kept, "host"), IFACES, enrolled=False, now=0)
    doc = q.apply(kept, answers)
    assert doc["node"] == {"data_dir": "/srv/rb", "shutdown_grace": 2.5, "name": "rb-a",
                           "rack": "r12"}  # fmt: skip
    assert doc["tftp"] == {"root": "/srv/tftp"}
    assert doc["cluster"] == {"port": 7500, "advertise": "10.0.0.5:7500"}
    assert doc["dhcp"]["lease_time"] == 600 and doc["dhcp"]["interfaces"] == ["eth1"]
    assert doc["dhcp"]["subnets"] == [
        {"network": "10.1.0.0/24", "interface": "eth1", "dns": ["10.1.0.53"],
         "router": "10.1.0.1", "pools": ["10.1.0.100-10.1.0.199"]},
        {"network": "10.8.0.0/24"},  # no interface: not the dialog's; eth0's is dropped
    ]  # fmt: skip
    assert doc["ha"] == {"lease": 2.0, "margin": 0.2, "vip": "10.1.0.2/24", "vip_interface": "eth1"}
    assert kept["node"] == {"data_dir": "/srv/rb", "shutdown_grace": 2.5}  # not edited in place
    assert answers.cluster == "new" and answers.token is None


def test_a_rerun_offers_every_current_value_and_enter_keeps_it():
    ask, _ = scripted(FIRST)
    first = q.apply({}, q.collect(ask, q.Current(), IFACES, enrolled=False, now=0))
    ask, asked = scripted({})  # [Enter] everywhere
    again = q.apply(first, q.collect(ask, q.Current.of(first, "host"), IFACES,
                                     enrolled=True, now=0))  # fmt: skip
    assert again == first
    assert asked == {
        "name": "rb-a", "rack": "r12", "management_address": "10.0.0.5", "interfaces": "eth1",
        "subnets.eth1.network": "10.1.0.0/24", "subnets.eth1.pools": "10.1.0.100-10.1.0.199",
        "subnets.eth1.router": "10.1.0.1", "vip": "10.1.0.2", "cluster": "keep",
    }  # fmt: skip


def test_a_new_subnet_asks_its_pool_again_and_no_vip_clears_it():
    ask, _ = scripted(FIRST)
    first = q.apply({}, q.collect(ask, q.Current(), IFACES, enrolled=False, now=0))
    ask, asked = scripted({"subnets.eth1.network": "10.2.0.0/24",
                           "subnets.eth1.pools": "10.2.0.10-10.2.0.20",
                           "subnets.eth1.router": "none", "vip": "none"})  # fmt: skip
    doc = q.apply(first, q.collect(ask, q.Current.of(first, "h"), IFACES, enrolled=True, now=0))
    assert asked["subnets.eth1.pools"] is None and asked["subnets.eth1.router"] == "none"
    assert doc["dhcp"]["subnets"] == [
        {"network": "10.2.0.0/24", "interface": "eth1", "pools": ["10.2.0.10-10.2.0.20"]}
    ]
    assert doc["ha"]["vip"] == "" and doc["ha"]["vip_interface"] == ""
    assert q.Current.of(doc, "h").vip == "none"


def test_two_interfaces_need_subnets_apart():
    ask, _ = scripted({**FIRST, "interfaces": "eth0, eth1", "subnets.eth0.network": "10.1.0.0/16",
                       "subnets.eth0.pools": "10.1.1.10-10.1.1.20",
                       "subnets.eth0.router": "none"})  # fmt: skip
    with pytest.raises(Invalid, match="apart from 10.1.0.0/16 \\(on eth0\\)"):
        q.collect(ask, q.Current(), IFACES, enrolled=False, now=0)


def test_a_pool_may_not_hold_the_management_address():
    ask, _ = scripted({**FIRST, "management_address": "10.1.0.150"})
    with pytest.raises(Invalid, match="leave out 10.1.0.150"):
        q.collect(ask, q.Current(), IFACES, enrolled=False, now=0)
