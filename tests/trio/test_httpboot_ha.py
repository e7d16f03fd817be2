"""HTTP boot in a rack of two real appliances and a witness over loopback (the election,
replication with TLS and signed frames, the real clock): the token secret and the events
an installer posts to the active are on the standby, and so is the machine's boot (the
nonce its token is made with), so after a hand-over the new active serves the same script
and token, under the same DHCP lease, and records the installer's next event. Tokens are
bound to the lease (the test writes the machine's lease for 127.0.0.1 as DHCP would)."""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from appliance.api import Role, hookimpl
from appliance.ha.witness import Witness, load_identity
from appliance.node import Node
from plugins.dhcp.leases import NAMESPACE as LEASES_NS
from plugins.dhcp.leases import Lease, LeaseState, lease_value
from plugins.httpboot.events import EVENTS_NS
from plugins.httpboot.machines import MACHINES_NS
from plugins.httpboot.plugin import HttpBootPlugin
from plugins.httpboot.store import Secret
from tests.support.ha import enrol_members, free_udp_ports, node_id
from tests.support.http import fetch
from tests.support.plugins import configured
from tests.trio.test_cluster import wait_until
from tests.trio.test_ha import CLUSTER

MAC = "52:54:00:12:34:56"
SCRIPT = "/boot/52-54-00-12-34-56.ipxe"
EVENTS = "/api/v1/machines/52-54-00-12-34-56/events"
MACHINE = "/api/v1/machines/52-54-00-12-34-56"


class Recorder:
    """A provisioning plugin: which events this node announced."""

    def __init__(self) -> None:
        self.events: list = []

    @hookimpl
    def httpboot_machine_event(self, event):
        self.events.append(event)


@asynccontextmanager
async def appliance(data_dir: Path, name: str, ha: dict):
    recorder = Recorder()
    document = {"node": {"name": name, "data_dir": str(data_dir)}, "cluster": CLUSTER, "ha": ha,
                "httpboot": {"port": 0, "bind_tokens_to_lease": True}}  # fmt: skip
    config, pm = configured(data_dir, document, httpboot=HttpBootPlugin(), recorder=recorder)
    node = Node(config, pm)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        yield node, recorder
        node.request_stop("test over")


@asynccontextmanager
async def rack(tmp_path: Path):
    dirs = enrol_members(tmp_path, ["a", "b", "w"])
    ports = dict(zip("abw", free_udp_ports(3), strict=True))
    addr = {n: f"{node_id(dirs[n])}@127.0.0.1:{port}" for n, port in ports.items()}
    witness = Witness(load_identity(str(dirs["w"])), "127.0.0.1", ports["w"], 1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: witness.run(handle_signals=False, task_status=task_status)
        )
        ha_a = {"port": ports["a"], "peers": [addr["b"]], "witnesses": [addr["w"]]}
        ha_b = {"port": ports["b"], "peers": [addr["a"]], "witnesses": [addr["w"]]}
        async with appliance(dirs["a"], "a", ha_a) as a, appliance(dirs["b"], "b", ha_b) as b:
            yield {"a": a, "b": b}
        nursery.cancel_scope.cancel()


def http(node: Node) -> tuple[str, int]:
    host, port = node.status()["httpboot"]["listening"][0].split(":")
    return host, int(port)


def token_of(script: bytes) -> str:
    return script.split(b"rackboot.token=")[1].split()[0].decode()


def body(stage: str) -> bytes:
    return json.dumps({"stage": stage, "status": "ok"}).encode()


async def test_the_standby_holds_the_events_and_the_secret_and_takes_over_with_them(tmp_path):
    async with rack(tmp_path) as appliances:
        nodes = {name: node for name, (node, _) in appliances.items()}
        await wait_until(lambda: sum(n.role is Role.ACTIVE for n in nodes.values()) == 1,
                         what="one active")  # fmt: skip
        first = next(name for name, n in nodes.items() if n.role is Role.ACTIVE)
        second = "b" if first == "a" else "a"
        (active, announced_first), (standby, announced_second) = (
            appliances[first],
            appliances[second],
        )
        # one secret for the rack: the active wrote it, the standby has it from the log
        await wait_until(lambda: Secret(standby.state)() is not None, what="the replicated secret")
        assert Secret(standby.state)() == Secret(active.state)()
        # the machine's DHCP lease, committed by the active (so on the standby too)
        mac = bytes.fromhex(MAC.replace(":", ""))
        starts = time.time()
        lease = Lease(0x7F000001, b"\x01" + mac, mac, "127.0.0.0/8", LeaseState.BOUND, starts,
                      starts + 3600)  # fmt: skip
        await active.state.put(LEASES_NS, "127.0.0.1", lease_value(lease))
        script = await fetch(http(active), "GET", SCRIPT)
        token = token_of(script.body)
        # the boot committed before the script left: the standby has it, and serves the
        # same token under the same lease
        assert standby.state.get(MACHINES_NS, MAC) == active.state.get(MACHINES_NS, MAC)
        assert token_of((await fetch(http(standby), "GET", SCRIPT)).body) == token
        bearer = [("authorization", f"Bearer {token}")]

        # the 201 leaves once the standby acknowledged the record: its table shows it
        reply = await fetch(http(active), "POST", EVENTS, headers=bearer, body=body("partition"))
        assert reply.status == 201 and json.loads(reply.body)["seq"] == 1
        assert standby.state.get(EVENTS_NS, f"{MAC}/0000000001")["stage"] == "partition"
        await wait_until(lambda: standby.status()["httpboot"]["machines_with_events"] == 1,
                         what="the standby's table")  # fmt: skip
        shown = json.loads((await fetch(http(standby), "GET", MACHINE)).body)
        assert [(e["seq"], e["stage"]) for e in shown["events"]] == [(1, "partition")]
        refused = await fetch(http(standby), "POST", EVENTS, headers=bearer, body=body("x"))
        assert refused.status == 503 and refused.header(b"retry-after") == b"1"
        assert [e.seq for e in announced_first.events] == [1] and announced_second.events == []

        # hand over: the new active serves the same script and records with the same token
        active.ha.demote({})
        await wait_until(lambda: standby.role is Role.ACTIVE and active.role is Role.STANDBY,
                         what="the hand-over")  # fmt: skip
        again = await fetch(http(standby), "GET", SCRIPT)
        assert again.status == 200 and token_of(again.body) == token
        reply = await fetch(http(standby), "POST", EVENTS, headers=bearer, body=body("install"))
        assert reply.status == 201 and json.loads(reply.body)["seq"] == 2
        assert [e.seq for e in announced_second.events] == [2]
        assert [e.seq for e in announced_first.events] == [1]  # once per event, by its writer
        # and the old active, a standby now, follows: it shows both
        await wait_until(lambda: active.state.get(EVENTS_NS, f"{MAC}/0000000002") is not None,
                         what="the old active to follow")  # fmt: skip
        await wait_until(lambda: active.status()["httpboot"]["events"]["events"] == 2,
                         what="the old active's table")  # fmt: skip
        shown = json.loads((await fetch(http(active), "GET", MACHINE)).body)
        assert [(e["seq"], e["stage"]) for e in shown["events"]] == [
            (1, "partition"),
            (2, "install"),
        ]
