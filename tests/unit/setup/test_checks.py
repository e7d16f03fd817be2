"""The setup dialog's answers checked one by one (appliance/setup/checks.py: pure)."""

from __future__ import annotations

import time
from ipaddress import IPv4Address as A
from ipaddress import IPv4Interface as I
from ipaddress import IPv4Network as N

import pytest

from appliance.cluster.jointoken import Token
from appliance.setup import checks as q
from appliance.setup.checks import Interface, Invalid, Provisioning

NET = N("10.1.0.0/24")
SUBNET = Provisioning("eth1", NET, A("10.1.0.5"), ((A("10.1.0.100"), A("10.1.0.199")),),
                      A("10.1.0.1"))  # fmt: skip
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
    assert "it routes nothing" in refused(q.check_router, "10.1.0.5", SUBNET)


def test_vip_in_a_provisioning_subnet_outside_pools_and_taken_addresses():
    mgmt = A("10.1.0.6")
    assert q.check_vip("10.1.0.2", [SUBNET], mgmt) == A("10.1.0.2")
    assert q.check_vip("none", [SUBNET], mgmt) is None
    assert "inside a provisioning subnet (10.1.0.0/24)" in refused(
        q.check_vip, "10.9.0.2", [SUBNET], mgmt
    )
    assert "outside the pools" in refused(q.check_vip, "10.1.0.199", [SUBNET], mgmt)
    assert "outside the pools" in refused(q.check_vip, "10.1.0.100", [SUBNET], mgmt)
    assert "broadcast" in refused(q.check_vip, "10.1.0.255", [SUBNET], mgmt)
    assert "of its own" in refused(q.check_vip, "10.1.0.1", [SUBNET], mgmt)
    assert "of its own" in refused(q.check_vip, "10.1.0.6", [SUBNET], mgmt)
    assert "of its own" in refused(q.check_vip, "10.1.0.5", [SUBNET], A("10.0.0.5"))


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


def test_one_management_interface_of_this_machine():
    assert q.check_interface("eth0", IFACES) == "eth0"
    assert "one interface" in refused(q.check_interface, "eth0, eth1", IFACES)
    assert "no 'eth9'" in refused(q.check_interface, "eth9", IFACES)


def test_the_management_address_carries_its_prefix_length():
    assert q.check_management_address("10.0.0.5/24") == I("10.0.0.5/24")
    for bad in ("10.0.0.5", "10.0.0.5/", "10.0.0.5/x", "10.0.0.5/31", "10.0.0.5/0"):
        assert "prefix length (1-30) such as 10.0.0.5/24" in refused(
            q.check_management_address, bad
        )
    assert "IPv4 address such as" in refused(q.check_management_address, "10.0.5/24")
    assert "broadcast" in refused(q.check_management_address, "10.0.0.255/24")
    assert "broadcast" in refused(q.check_management_address, "10.0.0.0/24")


def test_the_gateway_is_on_the_management_network_and_not_ours():
    mgmt = I("10.0.0.5/24")
    assert q.check_gateway("10.0.0.1", mgmt) == A("10.0.0.1")
    assert q.check_gateway("none", mgmt) is None
    assert "(10.0.1.1 is not)" in refused(q.check_gateway, "10.0.1.1", mgmt)
    assert "other than this appliance's" in refused(q.check_gateway, "10.0.0.5", mgmt)
    assert "'none'" in refused(q.check_gateway, "gw", mgmt)


def test_our_address_is_a_host_of_its_subnet():
    assert q.check_own_address("10.1.0.5", NET) == A("10.1.0.5")
    assert "(10.2.0.5 is not)" in refused(q.check_own_address, "10.2.0.5", NET)
    assert "broadcast" in refused(q.check_own_address, "10.1.0.255", NET)
