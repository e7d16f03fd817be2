"""The [dhcp] section: what spans keys is checked and named by key path."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from appliance.errors import ConfigError
from plugins.dhcp.model import BootFiles
from plugins.dhcp.plugin import DhcpPlugin
from tests.support.plugins import configured
from tests.unit.dhcp.clients import ip


def server_config(tmp_path, **dhcp):
    plugin = DhcpPlugin()
    configured(tmp_path, {"dhcp": dhcp}, dhcp=plugin)
    return plugin.server_config


def test_a_full_section_translates(tmp_path):
    cfg = server_config(
        tmp_path,
        interfaces=["eth1"],
        lease_time=600,
        boot={"bios": "pxe/undionly.kpxe"},
        subnets=[
            {
                "network": "192.0.2.0/24",
                "pools": ["192.0.2.150-192.0.2.199", "192.0.2.100-192.0.2.109"],
                "router": "192.0.2.1",
                "routes": ["10.0.0.0/8 via 192.0.2.254"],
                "boot": {"uefi_x64": "x64/ipxe.efi"},
            }
        ],
        reservations=[{"address": "192.0.2.10", "mac": "52:54:00:AB:CD:EF", "hostname": "n1"}],
    )
    (subnet,) = cfg.subnets
    assert subnet.pools == (
        (ip("192.0.2.100"), ip("192.0.2.109")),
        (ip("192.0.2.150"), ip("192.0.2.199")),
    )
    assert subnet.routes == ((IPv4Network("10.0.0.0/8"), IPv4Address("192.0.2.254")),)
    assert subnet.boot == BootFiles(bios="pxe/undionly.kpxe", uefi_x64="x64/ipxe.efi")
    assert cfg.boot.bios == "pxe/undionly.kpxe" and cfg.lease_time == 600
    assert cfg.reservations[0].mac == bytes.fromhex("525400abcdef")
    assert (cfg.server_port, cfg.client_port) == (6767, 6868)  # the test config is a dev node


def test_the_dev_node_boot_urls_name_the_dev_http_port(tmp_path):
    """The no-config node serves HTTP boot on 8080: its iPXE and UEFI HTTP URLs say so."""
    cfg = server_config(tmp_path)  # the test config is a dev node
    assert cfg.boot.ipxe_script == "http://{server}:8080/boot/{mac}.ipxe"
    assert cfg.boot.http_x64 == "http://{server}:8080/boot/ipxe.efi"
    assert cfg.boot.bios == BootFiles().bios  # TFTP paths carry no port


@pytest.mark.parametrize(
    ("dhcp", "message"),
    [
        (
            {"subnets": [{"network": "192.0.2.0/24", "pools": ["192.0.2.200-192.0.2.100"]}]},
            "dhcp.subnets[0].pools[0]: expected a range first <= last inside 192.0.2.0/24",
        ),
        (
            {"subnets": [{"network": "192.0.2.0/24", "pools": ["192.0.2.100-192.0.3.10"]}]},
            "dhcp.subnets[0].pools[0]: expected a range first <= last inside 192.0.2.0/24",
        ),
        (
            {
                "subnets": [
                    {
                        "network": "192.0.2.0/24",
                        "pools": ["192.0.2.1-192.0.2.50", "192.0.2.50-192.0.2.60"],
                    }
                ]
            },
            "dhcp.subnets[0].pools: expected ranges that do not overlap",
        ),
        (
            {"subnets": [{"network": "192.0.2.0/24", "pools": ["192.0.2.1"]}]},
            "dhcp.subnets[0].pools[0]: expected an address range 'first-last'",
        ),
        (
            {"subnets": [{"network": "192.0.2.0/24"}, {"network": "192.0.2.128/25"}]},
            "dhcp.subnets[1].network: expected a network not overlapping dhcp.subnets[0]",
        ),
        (
            {"subnets": [{"network": "192.0.2.0/24", "routes": ["10.0.0.1/8 via 192.0.2.1"]}]},
            "dhcp.subnets[0].routes[0]: expected 'network/len via gateway' with host bits clear",
        ),
        (
            {"subnets": [{"network": "192.0.2.0/24"}], "reservations": [{"address": "192.0.2.5"}]},
            "dhcp.reservations[0]: expected exactly one of 'mac' or 'client_id'",
        ),
        (
            {
                "subnets": [{"network": "192.0.2.0/24"}],
                "reservations": [{"address": "198.51.100.5", "mac": "52:54:00:00:00:01"}],
            },
            "dhcp.reservations[0].address: expected an address inside one of dhcp.subnets",
        ),
        (
            {"reservations": [{"address": "192.0.2.5", "mac": "52:54:00"}]},
            "dhcp.reservations[0].mac: expected a MAC",
        ),
        ({"probe": "arp"}, "dhcp.probe: expected one of 'none', 'icmp'"),
    ],
)
def test_errors_name_the_key(tmp_path, dhcp, message):
    with pytest.raises(ConfigError) as caught:
        server_config(tmp_path, **dhcp)
    assert message in str(caught.value)
    assert str(caught.value).startswith("<test>: ")
