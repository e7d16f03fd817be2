"""A machine's boot as the provisioning workflow sees it, in one node (real loopback
sockets: HTTP boot, TFTP, events; leases written into the state as the DHCP plugin
writes them; the machine connects from 127.0.0.3, its leased address).

Its script is its record's profile while it is being provisioned (the fetch is its
loader stage) and its local disk otherwise; its kernel over HTTP and its initrd over
TFTP move it to the kernel stage; files fetched from an address no lease of it holds
change nothing."""

from __future__ import annotations

import ipaddress
import time

import trio

from plugins.dhcp.leases import Lease, LeaseState
from plugins.provisioning.plugin import ProvisioningPlugin
from plugins.tftp import plugin as tftp_plugin
from tests.support.tftp import fetch as tftp_fetch
from tests.trio.test_httpboot_plugin import PROFILES, bearer, event_body, running, token_of
from tests.trio.test_httpboot_tokens import fetch_from, lease
from tests.trio.test_provisioning_plugin import PowerLog, call, until

LIMIT = 30
MAC = "52:54:00:00:00:01"
AT = "127.0.0.3"
SCRIPT = "/boot/52-54-00-00-00-01.ipxe"
PROFILES_WITH_TFTP_INITRD = [*PROFILES, {"name": "split", "kernel": "split/linux",
                                         "initrd": ["split/initrd.gz"]}]  # fmt: skip
DOCUMENT = {
    "httpboot": {"port": 0, "profiles": PROFILES_WITH_TFTP_INITRD, "bind_tokens_to_lease": True},
    "dhcp": {"interfaces": []},
    "tftp": {"port": 0},
    "provisioning": {
        "machines": [{"name": "web1", "macs": [MAC], "profile": "split", "initrds": 1}],
    },
}


def state_of(node, name: str = "web1") -> str:
    return _flow(node).machines[name].state


def _flow(node):
    for plugin in node.pm.get_plugins():
        if isinstance(plugin, ProvisioningPlugin):
            return plugin.flow
    raise AssertionError("no provisioning plugin")


async def tftp_from(node, source: str, name: str):
    host, port = node.status()["tftp"]["listening"][0].split(":")
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind((source, 0))
    with sock:
        return await tftp_fetch((host, int(port)), name, sock=sock)


async def test_a_machine_boots_its_record_while_provisioned_and_its_disk_otherwise(tmp_path):
    power = PowerLog()
    root = tmp_path / "data" / "httpboot" / "root"
    with trio.fail_after(LIMIT):
        async with running(tmp_path, DOCUMENT, tftp=tftp_plugin, provisioning=ProvisioningPlugin(),
                           power=power) as (node, listening):  # fmt: skip
            host, port = listening.split(":")
            where = (host, int(port))
            await lease(node, AT, MAC)
            await until(lambda: "web1" in _flow(node).machines, 5)

            idle = await fetch_from(AT, where, "GET", SCRIPT)
            assert idle.status == 200 and b"\nexit\n" in idle.body  # not asked: its disk
            assert state_of(node) == "idle"

            await call(node, "machines.reprovision", name="web1")
            await until(lambda: power.actions == [("web1", "on")], 5)
            node.pm.hook.dhcp_lease_committed(lease=Lease(
                int(ipaddress.IPv4Address(AT)), b"\x01" + bytes.fromhex(MAC.replace(":", "")),
                bytes.fromhex(MAC.replace(":", "")), "127.0.0.0/8", LeaseState.BOUND,
                time.time(), time.time() + 3600))  # fmt: skip
            await until(lambda: state_of(node) == "discovered", 5)

            script = await fetch_from(AT, where, "GET", SCRIPT)
            assert script.status == 200 and b"/boot/split/linux" in script.body
            await until(lambda: state_of(node) == "loader", 5)

            (root / "split").mkdir(parents=True)
            (root / "split" / "linux").write_bytes(b"K" * 3000)
            tftp_root = tmp_path / "data" / "tftp" / "root"
            (tftp_root / "split").mkdir(parents=True)
            (tftp_root / "split" / "initrd.gz").write_bytes(b"I" * 3000)
            # Someone else fetching the machine's files is not the machine.
            assert (await fetch_from("127.0.0.4", where, "GET", "/boot/split/linux")).status == 200
            assert (await tftp_from(node, "127.0.0.4", "split/initrd.gz")).data == b"I" * 3000
            assert (await fetch_from(AT, where, "GET", "/boot/split/linux")).status == 200
            await trio.sleep(0.2)
            assert state_of(node) == "loader"  # the kernel, not yet the initrd
            assert (await tftp_from(node, AT, "split/initrd.gz")).data == b"I" * 3000
            await until(lambda: state_of(node) == "kernel", 5)

            token = token_of(script.body)
            posted = await fetch_from(AT, where, "POST", "/api/v1/machines/52-54-00-00-00-01/events",
                                      headers=bearer(token), body=event_body())  # fmt: skip
            assert posted.status in (200, 201), posted
            await until(lambda: state_of(node) == "provisioned", 5)
            again = await fetch_from(AT, where, "GET", SCRIPT)
            assert b"\nexit\n" in again.body  # the installer rebooted: no second install
