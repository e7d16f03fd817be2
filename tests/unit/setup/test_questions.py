"""The setup dialog's questions in order, and how answers edit a document
(appliance/setup/questions.py: pure, no terminal)."""

from __future__ import annotations

import pytest

from appliance.setup import questions as q
from appliance.setup.checks import Interface, Invalid

IFACES = [Interface("eth0", "up", "52:54:00:00:00:01"), Interface("eth1", "down", "-")]


def scripted(answers: dict[str, str]):
    """An ``ask`` that answers by key, recording the questions and their defaults."""
    asked = {}

    def ask(question):
        key = ".".join(question.key)
        asked[key] = question.default
        return question.check(answers.get(key) or question.default)

    return ask, asked


FIRST = {
    "name": "rb-a", "rack": "r12", "management_interface": "eth0",
    "management_address": "10.0.0.5/24", "management_gateway": "10.0.0.1", "interfaces": "eth1",
    "subnets.eth1.network": "10.1.0.0/24", "subnets.eth1.address": "10.1.0.5",
    "subnets.eth1.pools": "10.1.0.100-10.1.0.199", "subnets.eth1.router": "10.1.0.1",
    "vip": "10.1.0.2",
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
    assert doc["network"] == {
        "management_interface": "eth0", "management_address": "10.0.0.5/24",
        "management_gateway": "10.0.0.1",
        "provisioning": [{"interface": "eth1", "address": "10.1.0.5/24"}],
    }  # fmt: skip
    assert kept["node"] == {"data_dir": "/srv/rb", "shutdown_grace": 2.5}  # not edited in place
    assert answers.cluster == "new" and answers.token is None


def test_a_rerun_offers_every_current_value_and_enter_keeps_it():
    ask, _ = scripted(FIRST)
    first = q.apply({}, q.collect(ask, q.Current(), IFACES, enrolled=False, now=0))
    ask, asked = scripted({})  # [Enter] everywhere
    again = q.apply(first, q.collect(ask, q.Current.of(first, "host"), IFACES,
                                     enrolled=True, now=0))  # fmt: skip
    assert again == first
    assert asked == {**FIRST, "cluster": "keep"}


def test_a_new_subnet_asks_its_pool_again_and_no_vip_clears_it():
    ask, _ = scripted(FIRST)
    first = q.apply({}, q.collect(ask, q.Current(), IFACES, enrolled=False, now=0))
    ask, asked = scripted({"subnets.eth1.network": "10.2.0.0/24",
                           "subnets.eth1.address": "10.2.0.5",
                           "subnets.eth1.pools": "10.2.0.10-10.2.0.20",
                           "subnets.eth1.router": "none", "vip": "none"})  # fmt: skip
    doc = q.apply(first, q.collect(ask, q.Current.of(first, "h"), IFACES, enrolled=True, now=0))
    assert asked["subnets.eth1.pools"] is None and asked["subnets.eth1.router"] == "none"
    assert asked["subnets.eth1.address"] is None  # 10.1.0.5 is not in the new subnet
    assert doc["network"]["provisioning"] == [{"interface": "eth1", "address": "10.2.0.5/24"}]
    assert doc["dhcp"]["subnets"] == [
        {"network": "10.2.0.0/24", "interface": "eth1", "pools": ["10.2.0.10-10.2.0.20"]}
    ]
    assert doc["ha"]["vip"] == "" and doc["ha"]["vip_interface"] == ""
    assert q.Current.of(doc, "h").vip == "none"


def test_two_interfaces_need_subnets_apart():
    ask, _ = scripted({**FIRST, "interfaces": "eth0, eth1", "subnets.eth0.network": "10.1.0.0/16",
                       "subnets.eth0.address": "10.1.1.5",
                       "subnets.eth0.pools": "10.1.1.10-10.1.1.20",
                       "subnets.eth0.router": "none"})  # fmt: skip
    with pytest.raises(Invalid, match="apart from 10.1.0.0/16 \\(on eth0\\)"):
        q.collect(ask, q.Current(), IFACES, enrolled=False, now=0)


def test_a_pool_may_not_hold_our_own_addresses():
    ask, _ = scripted({**FIRST, "subnets.eth1.address": "10.1.0.150"})
    with pytest.raises(Invalid, match="leave out 10.1.0.150"):
        q.collect(ask, q.Current(), IFACES, enrolled=False, now=0)
    shared = {**FIRST, "management_interface": "eth1", "management_address": "10.1.0.150/24",
              "management_gateway": "none", "subnets.eth1.address": "10.1.0.5"}  # fmt: skip
    with pytest.raises(Invalid, match="leave out 10.1.0.150"):
        q.collect(scripted(shared)[0], q.Current(), IFACES, enrolled=False, now=0)


def test_a_provisioning_subnet_apart_from_the_management_network_elsewhere():
    ask, _ = scripted({**FIRST, "management_address": "10.1.0.7/16", "management_gateway": "none"})
    with pytest.raises(Invalid, match="apart from the management network 10.1.0.0/16 \\(on eth0"):
        q.collect(ask, q.Current(), IFACES, enrolled=False, now=0)


def test_management_and_provisioning_may_share_an_interface():
    """One NIC: its management address, in the provisioning subnet, is offered as ours there."""
    ask, asked = scripted({**FIRST, "management_interface": "eth1",
                           "management_address": "10.1.0.7/24", "management_gateway": "10.1.0.1",
                           "subnets.eth1.address": ""})  # fmt: skip
    doc = q.apply({}, q.collect(ask, q.Current(), IFACES, enrolled=False, now=0))
    assert asked["subnets.eth1.address"] == "10.1.0.7"
    assert doc["network"]["provisioning"] == [{"interface": "eth1", "address": "10.1.0.7/24"}]
