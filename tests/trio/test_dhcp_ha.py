"""DHCP on two real appliances of a rack and a witness, in one process over loopback (the
election over UDP, replication over TLS): a lease the active acknowledged is in the
standby's table; after a hand-over the new active gives that address to nobody else and
acknowledges the original client's renewal; the standby answers nothing dynamic.

Each appliance serves DHCP on ``lo`` on a port of its own, the client talking to whichever
is active (what the VIP does on a real link)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

import trio

from appliance.api import Role
from appliance.ha.witness import Witness, load_identity
from appliance.node import Node
from plugins.dhcp.options import MessageType
from plugins.dhcp.plugin import DhcpPlugin
from tests.support.ha import enrol_members, free_udp_ports, node_id
from tests.support.plugins import configured
from tests.trio.test_cluster import wait_until
from tests.trio.test_dhcp_service import Client, dhcp_document
from tests.trio.test_ha import CLUSTER
from tests.unit.dhcp.clients import mac, message


@asynccontextmanager
async def dhcp_node(data_dir: Path, name: str, ha: dict, port: int):
    plugin = DhcpPlugin()
    document = {"node": {"name": name, "data_dir": str(data_dir)}, "cluster": CLUSTER, "ha": ha,
                **dhcp_document(port)}  # fmt: skip
    config, pm = configured(data_dir, document, dhcp=plugin)
    node = Node(config, pm)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        yield node, plugin
        node.request_stop("test over")


@asynccontextmanager
async def dhcp_rack(tmp_path: Path):
    names = ["a", "b", "w"]
    dirs = enrol_members(tmp_path, names)
    pa, pb, pw = free_udp_ports(3)
    ports = {"a": pa, "b": pb, "w": pw}
    addr = {n: f"{node_id(dirs[n])}@127.0.0.1:{port}" for n, port in ports.items()}
    da, db = free_udp_ports(2)
    witness = Witness(load_identity(str(dirs["w"])), "127.0.0.1", pw, 1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: witness.run(handle_signals=False, task_status=task_status)
        )
        ha_a = {"port": pa, "peers": [addr["b"]], "witnesses": [addr["w"]]}
        ha_b = {"port": pb, "peers": [addr["a"]], "witnesses": [addr["w"]]}
        async with (
            dhcp_node(dirs["a"], "a", ha_a, da) as (a, pa_),
            dhcp_node(dirs["b"], "b", ha_b, db) as (b, pb_),
        ):
            yield {"a": (a, pa_, da), "b": (b, pb_, db)}
        nursery.cancel_scope.cancel()


def active_of(rack) -> str | None:
    names = [n for n, (node, plugin, _) in rack.items()
             if node.role is Role.ACTIVE and plugin.service.server.active]  # fmt: skip
    return names[0] if len(names) == 1 else None


async def test_an_acked_lease_survives_a_hand_over_and_is_given_to_nobody_else(tmp_path):
    with trio.fail_after(60):
        async with dhcp_rack(tmp_path) as rack:
            await wait_until(lambda: active_of(rack) is not None, what="one active answering")
            first = active_of(rack)
            second = "b" if first == "a" else "a"
            active, active_plugin, active_port = rack[first]
            standby, standby_plugin, standby_port = rack[second]
            await wait_until(
                lambda: standby.replication.following.get("stage") == "stream",
                what="the standby to follow",
            )
            async with Client(active_port) as client:
                offer, ack = await client.dora(mac(1))
            assert ack.message_type is MessageType.ACK
            address = int(ack.yiaddr)
            # Acknowledged, so committed: on the standby's disk and, by its changefeed, in
            # the table its server reads.
            table = standby_plugin.service.server.leases.table
            await wait_until(lambda: table.get(address) is not None, what="the standby's table")
            assert table.get(address).client == b"\x01" + mac(1)
            # The standby answers nothing dynamic, and writes nothing: with no reservation
            # to answer it does not even hear (the kernel drops what reaches its socket).
            heard = standby_plugin.service.metrics.totals["received"]
            async with Client(standby_port) as client:
                await client.send(message(MessageType.DISCOVER, mac(2)))
                await client.send(message(MessageType.REQUEST, mac(1), ciaddr=str(ack.yiaddr)))
                with trio.move_on_after(0.5):
                    await client.sock.recvfrom(65535)
                    raise AssertionError("the standby answered")
            assert standby_plugin.service.metrics.totals["received"] == heard
            lsn = standby.state.position.lsn
            # Hand over.
            active.ha.demote({})
            await wait_until(lambda: active_of(rack) == second, what="the hand-over")
            async with Client(standby_port) as client:
                # A new client's DISCOVER: the pool cursor starts at 0 on this node, yet
                # the address it was fed stays with its owner.
                offer = await client.ask(message(MessageType.DISCOVER, mac(3)))
                assert offer.message_type is MessageType.OFFER and int(offer.yiaddr) != address
                taken = await client.ask(
                    message(MessageType.REQUEST, mac(3), requested=str(ack.yiaddr))
                )
                assert taken.message_type is MessageType.NAK
                # The original client renews (RENEWING: ciaddr, no server identifier).
                renewed = await client.ask(
                    message(MessageType.REQUEST, mac(1), ciaddr=str(ack.yiaddr))
                )
                assert renewed.message_type is MessageType.ACK and int(renewed.yiaddr) == address
            assert standby.state.position.lsn > lsn  # the new active wrote the renewal
            # ... which the old active, now the standby, follows. Both tables change by
            # their changefeeds, a task step after the commit (and a retransmitted REQUEST
            # may commit a second renewal): compare them once both are at the last record.
            old_table = active_plugin.service.server.leases.table
            new_table = standby_plugin.service.server.leases.table
            await wait_until(lambda: old_table.lsn == new_table.lsn == standby.state.position.lsn,
                             what="both tables at the new active's last record")  # fmt: skip
            assert old_table.get(address) == new_table.get(address)
