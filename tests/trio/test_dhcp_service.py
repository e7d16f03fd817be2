"""The DHCP plugin in a node, over real loopback sockets: an ACK only once its lease's
record committed in the state log, drops counted, hooks called, leases surviving a
restart, the journal of an earlier release imported."""

from __future__ import annotations

import socket
from ipaddress import IPv4Address

import pytest
import trio

from appliance.api import hookimpl
from appliance.journal import frame
from appliance.node import Node
from appliance.state.log import StateLog
from plugins.dhcp.codec import parse_untrusted
from plugins.dhcp.leases import (
    NAMESPACE,
    Lease,
    LeaseState,
    encode_lease,
    lease_from_state_untrusted,
)
from plugins.dhcp.model import Reservation
from plugins.dhcp.options import MessageType, Opt
from plugins.dhcp.plugin import DhcpPlugin
from tests.support.plugins import configured
from tests.unit.dhcp.clients import ip, mac, message


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dhcp_document(port: int, **dhcp) -> dict:
    return {
        "dhcp": {
            "interfaces": ["lo"],
            "port": port,
            "subnets": [
                {
                    "network": "127.0.0.0/8",
                    "pools": ["127.0.100.10-127.0.100.19"],
                    "dns": ["127.0.0.53"],
                }
            ],
            **dhcp,
        }
    }


class Client:
    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    async def __aenter__(self):
        await self.sock.bind(("127.0.0.1", 0))
        return self

    async def __aexit__(self, *exc):
        self.sock.close()

    async def ask(self, data: bytes):
        await self.sock.sendto(data, ("127.0.0.1", self.port))
        with trio.fail_after(5):
            reply, _ = await self.sock.recvfrom(65535)
        return parse_untrusted(reply)

    async def send(self, data: bytes) -> None:
        await self.sock.sendto(data, ("127.0.0.1", self.port))

    async def dora(self, hw: bytes, **kw):
        offer = await self.ask(message(MessageType.DISCOVER, hw, **kw))
        ack = await self.ask(
            message(
                MessageType.REQUEST,
                hw,
                requested=str(offer.yiaddr),
                server_id=offer.server_id,
                **kw,
            )
        )
        return offer, ack


async def run_node(nursery, tmp_path, document, **plugins) -> Node:
    config, pm = configured(tmp_path, document, dhcp=DhcpPlugin(), **plugins)
    node = Node(config, pm)
    await nursery.start(lambda task_status: node.run(handle_signals=False, task_status=task_status))
    return node


def state_leases(tmp_path) -> list[Lease]:
    """The leases in the node's state log on disk, as a restart would read them."""
    log = StateLog(tmp_path / "data" / "state" / "log")
    try:
        tables = log.open().tables
    finally:
        log.close()
    return [lease_from_state_untrusted(k, v) for k, v in tables.scan(NAMESPACE)]


async def test_ack_only_after_the_lease_is_on_disk_and_leases_survive_a_restart(tmp_path):
    port = free_udp_port()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery, Client(port) as client:
            node = await run_node(nursery, tmp_path, dhcp_document(port))
            offer, ack = await client.dora(mac(1))
            assert ack.message_type is MessageType.ACK and ack.yiaddr == offer.yiaddr
            assert ack.options[Opt.DNS_SERVERS] == IPv4Address("127.0.0.53").packed
            # The ACK came back, so its record is already committed in the state log.
            (record,) = state_leases(tmp_path)
            assert (record.address, record.state) == (int(ack.yiaddr), LeaseState.BOUND)
            node.request_stop()

        async with trio.open_nursery() as nursery, Client(port) as client:
            node = await run_node(nursery, tmp_path, dhcp_document(port))
            # INIT-REBOOT after the restart: the server remembers the lease.
            again = await client.ask(
                message(MessageType.REQUEST, mac(1), requested=str(ack.yiaddr))
            )
            assert again.message_type is MessageType.ACK
            # And another client asking for it is refused.
            nak = await client.ask(message(MessageType.REQUEST, mac(2), requested=str(ack.yiaddr)))
            assert nak.message_type is MessageType.NAK
            status = node.status()["dhcp"]
            assert status["pools"]["127.0.0.0/8"] == {"active": 1, "size": 10}
            node.request_stop()


async def test_malformed_datagrams_are_counted_and_service_goes_on(tmp_path):
    port = free_udp_port()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery, Client(port) as client:
            node = await run_node(nursery, tmp_path, dhcp_document(port))
            for junk in (
                b"",
                b"\x01" * 50,
                b"\x01" * 300,
                message(MessageType.DISCOVER, mac(9))[:240] + b"\x35\x05\x01",
            ):
                await client.send(junk)
            _, ack = await client.dora(mac(1))
            assert ack.message_type is MessageType.ACK
            metrics = node.metrics
            dropped = {
                s.labels["reason"]: s.value
                for m in metrics.collect()
                if m.name == "rackboot_dhcp_dropped"
                for s in m.samples
                if s.name.endswith("_total")
            }
            assert (
                dropped["malformed:too-short"] == 2 and dropped["malformed:truncated-option"] >= 1
            )
            assert sum(dropped.values()) == 4
            node.request_stop()


async def test_hooks_look_hosts_up_change_options_and_hear_of_leases(tmp_path):
    port = free_udp_port()
    committed, released = [], []

    class Site:
        @hookimpl
        def dhcp_host_lookup(self, mac, client_id):
            if mac.endswith(":07"):
                return Reservation(ip("127.0.50.7"), hostname="inventory-7")
            return None

        @hookimpl
        def dhcp_reply_options(self, request, reply, lease):
            reply.options[224] = b"rack-42"

        @hookimpl
        def dhcp_lease_committed(self, lease):
            committed.append(lease)

        @hookimpl
        def dhcp_lease_released(self, lease):
            released.append(lease)

    class Broken:
        @hookimpl
        def dhcp_boot_selection(self, request, default):
            raise RuntimeError("inventory down")

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery, Client(port) as client:
            node = await run_node(
                nursery, tmp_path, dhcp_document(port), site=Site(), broken=Broken()
            )
            pxe = {Opt.VENDOR_CLASS: b"PXEClient:Arch:00000:UNDI:002001"}
            offer, ack = await client.dora(mac(7), options=pxe)
            assert ack.yiaddr == IPv4Address("127.0.50.7") and ack.options[224] == b"rack-42"
            assert ack.options[Opt.HOSTNAME] == b"inventory-7"
            # The raising boot hook was logged and ignored: the default table answered.
            assert ack.options[Opt.BOOTFILE_NAME] == b"undionly.kpxe"
            await client.send(message(MessageType.RELEASE, mac(7), ciaddr=str(ack.yiaddr)))
            with trio.fail_after(5):
                while not released:
                    await trio.sleep(0.01)
            assert [c.hostname for c in committed] == ["inventory-7"]
            assert released[0].state is LeaseState.RELEASED
            node.request_stop()


@pytest.mark.parametrize("enabled", [False, True])
async def test_no_interfaces_or_disabled_means_not_serving(tmp_path, enabled):
    document = {"dhcp": {"enabled": enabled, "interfaces": []}}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            node = await run_node(nursery, tmp_path, document)
            assert node.status()["dhcp"] == {"serving": False}
            assert "dhcp.server" not in node.service_state
            node.request_stop()


async def test_a_node_upgraded_from_the_lease_journal_imports_it_once(tmp_path):
    """An earlier release's ``dhcp/leases.journal``: its leases are in the state log once
    the node is active (blocking their addresses meanwhile), the file is renamed aside,
    and after a restart the leases are still served from the log."""
    import time

    now = time.time()
    journal = tmp_path / "data" / "dhcp" / "leases.journal"
    journal.parent.mkdir(parents=True)
    old = [
        Lease(
            ip(f"127.0.100.{10 + n}"),
            b"\x01" + mac(n),
            mac(n),
            "127.0.0.0/8",
            LeaseState.BOUND,
            now,
            now + 3600,
        )  # fmt: skip
        for n in range(1, 4)
    ]
    journal.write_bytes(b"".join(frame(encode_lease(lease)) for lease in old))
    port = free_udp_port()
    for start in range(2):
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery, Client(port) as client:
                node = await run_node(nursery, tmp_path, dhcp_document(port))
                # Free in nobody's eyes but its owner's, imported or being imported.
                nak = await client.ask(
                    message(MessageType.REQUEST, mac(9), requested="127.0.100.11")
                )
                assert nak.message_type is MessageType.NAK
                ack = await client.ask(
                    message(MessageType.REQUEST, mac(1), requested="127.0.100.11")
                )
                assert ack.message_type is MessageType.ACK
                offer = await client.ask(message(MessageType.DISCOVER, mac(8)))
                assert str(offer.yiaddr) not in {"127.0.100.11", "127.0.100.12", "127.0.100.13"}
                with trio.fail_after(5):
                    while journal.exists():
                        await trio.sleep(0.01)
                if start == 0:
                    assert node.status()["dhcp"]["journal"]["imported"] == 3
                else:
                    assert "journal" not in node.status()["dhcp"]
                node.request_stop()
    assert journal.with_name("leases.journal.imported").exists()
    assert {lease.address for lease in state_leases(tmp_path)} == {lease.address for lease in old}
