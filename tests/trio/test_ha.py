"""The HA service in real nodes over loopback UDP (real clock, every wait bounded):
one active, stop the active and the standby takes over, demote and promote,
maintenance, the witness, and what is refused."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from appliance.api import Role
from appliance.errors import RackbootError
from appliance.ha.envelope import seal
from appliance.ha.messages import Prepare
from appliance.ha.witness import Witness, load_identity
from appliance.node import Node
from tests.support.ha import enrol_members, free_udp_ports, node_id
from tests.support.plugins import configured
from tests.trio.test_cluster import wait_until

CLUSTER = {"port": 0, "keepalive": 0.2, "dead_after": 1.0}


@asynccontextmanager
async def node_running(data_dir: Path, name: str, ha: dict, speaks=None):
    """``speaks``: the version and protocols the node states (appliance/compat.py)."""
    config, pm = configured(
        data_dir,
        {"node": {"name": name, "data_dir": str(data_dir)}, "cluster": CLUSTER, "ha": ha},
    )
    node = Node(config, pm)
    node.speaks = speaks or node.speaks
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        yield node
        node.request_stop("test over")


@asynccontextmanager
async def rack(tmp_path: Path, speaks: dict | None = None, **ha):
    """Appliances a and b and a witness; ``speaks``: name -> what that node states."""
    speaks = speaks or {}
    names = ["a", "b", "w"]
    if (tmp_path / "a" / "cluster").exists():  # a restart of the same rack
        dirs = {name: tmp_path / name for name in names}
    else:
        dirs = enrol_members(tmp_path, names)
    pa, pb, pw = free_udp_ports(3)
    ports = {"a": pa, "b": pb, "w": pw}
    addr = {n: f"{node_id(dirs[n])}@127.0.0.1:{port}" for n, port in ports.items()}
    witness = Witness(load_identity(str(dirs["w"])), "127.0.0.1", pw, 1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: witness.run(handle_signals=False, task_status=task_status)
        )
        ha_a = {"port": pa, "peers": [addr["b"]], "witnesses": [addr["w"]], **ha}
        ha_b = {"port": pb, "peers": [addr["a"]], "witnesses": [addr["w"]], **ha}
        async with node_running(dirs["a"], "a", ha_a, speaks.get("a")) as a, \
                node_running(dirs["b"], "b", ha_b, speaks.get("b")) as b:  # fmt: skip
            yield {"a": a, "b": b}, witness
        nursery.cancel_scope.cancel()


def actives(nodes) -> list[str]:
    return [name for name, node in nodes.items() if node.role is Role.ACTIVE]


async def test_one_appliance_becomes_active_and_the_fence_follows_the_lease(tmp_path):
    async with rack(tmp_path) as (nodes, witness):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        await trio.sleep(1.0)  # renewals keep it, nobody else takes it
        assert len(actives(nodes)) == 1
        active = nodes[actives(nodes)[0]]
        standby = next(n for n in nodes.values() if n is not active)
        assert active.fence.ok() and not standby.fence.ok()
        status = active.ha.status()
        # epoch 1, unless a loaded machine starved a renewal and the lease was taken again
        assert status["epoch"] >= 1 and 0 < status["valid_for"] <= 0.85
        assert status["election"]["quorum"] == 2 and status["election"]["acceptors"] == 3
        holder = active.cluster.identity.node_id
        await wait_until(
            lambda: standby.ha.status()["election"]["holder_seen"] == holder, timeout=3
        )
        assert witness.status()["racks"]["rack1"]["known_epoch"] == status["epoch"]
        assert standby.status()["core"]["ha"]["role"] == "standby"


async def test_stopping_the_active_releases_and_the_standby_takes_over_at_once(tmp_path):
    async with rack(tmp_path) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        old = actives(nodes)[0]
        other = "b" if old == "a" else "a"
        nodes[old].request_stop("test")
        started = trio.current_time()
        await wait_until(lambda: actives(nodes) == [other], timeout=3, what="takeover")
        assert trio.current_time() - started < 0.8  # the release, not the lease's end
        assert nodes[other].ha.status()["epoch"] >= 2


async def test_demote_promote_and_maintenance(tmp_path):
    async with rack(tmp_path) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        first = actives(nodes)[0]
        second = "b" if first == "a" else "a"
        nodes[first].ha.demote({})
        await wait_until(lambda: actives(nodes) == [second], timeout=2, what="demote")
        nodes[first].ha.promote({})
        await wait_until(lambda: actives(nodes) == [first], timeout=2, what="promote")
        nodes[second].ha.maintenance({"on": True})
        nodes[first].ha.maintenance({"on": True})  # the holder goes into maintenance too
        await wait_until(lambda: actives(nodes) == [], timeout=2, what="nobody in maintenance")
        with pytest.raises(Exception, match="in maintenance"):
            nodes[first].ha.promote({})
        nodes[second].ha.maintenance({"on": False})
        await wait_until(lambda: actives(nodes) == [second], timeout=2, what="maintenance off")
        assert nodes[second].ha.status()["epoch"] >= 4  # one per change of holder


async def test_a_stranger_datagram_is_refused_and_counted(tmp_path):
    async with rack(tmp_path) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        outsider = enrol_members(tmp_path / "other", ["x"])["x"]  # another cluster
        identity = load_identity(str(outsider))
        from appliance.cluster import pki

        datagram = seal(
            Prepare("rack1", 1, 99, "d" * 32, ["a" * 16]), identity.key, pki.cert_der(identity.cert)
        )
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        with sock:
            await sock.sendto(datagram, ("127.0.0.1", nodes["a"].ha.transport.port))
            await sock.sendto(b"garbage", ("127.0.0.1", nodes["a"].ha.transport.port))
        await wait_until(lambda: nodes["a"].ha.transport.counters["refused"] == 2, timeout=2)
        assert len(actives(nodes)) == 1


async def test_peers_without_a_cluster_identity_refuse_to_start(tmp_path):
    config, pm = configured(
        tmp_path,
        {"node": {"name": "lonely", "data_dir": str(tmp_path / "lonely")},
         "ha": {"peers": [f"{'a' * 16}@127.0.0.1:9"], "witnesses": [f"{'b' * 16}@127.0.0.1:10"]}},
    )  # fmt: skip
    with pytest.raises(RackbootError, match="no cluster identity"):
        await Node(config, pm).run(handle_signals=False)


async def test_status_of_a_standalone_node_is_valid_json_and_reads_without_end(tmp_path):
    """An endless lease used to print ``valid_for: Infinity`` (not JSON) and ``valid for infs``."""
    import json

    from appliance.ha.plugin import render_status

    async with node_running(tmp_path / "s", "s", {}) as node:
        await wait_until(lambda: node.role is Role.ACTIVE, what="standalone active")
        status = node.status()
        json.dumps(status, allow_nan=False)  # raises on Infinity or NaN
        assert status["core"]["ha"]["valid_for"] is None
        assert "valid without end" in render_status(node.ha.status())


async def test_the_election_state_survives_restarts_and_request_ids_rise(tmp_path):
    """Epoch, the longest lease granted and the boot count are kept in ha/state.json."""
    from appliance.ha.service import read_durable

    async with rack(tmp_path, lease=2.0, renew=0.5, margin=0.3) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, timeout=10, what="one active")
        first = {n: node.ha.election.proposer._req for n, node in nodes.items()}
    state = read_durable(tmp_path / "a" / "ha")
    assert state.boots == 1 and state.longest_lease == 2.0 and state.epoch >= 1
    # lowered lease: the restart wait still covers the 2 s grants of the previous life
    async with rack(tmp_path, lease=1.0) as (nodes, _):
        assert nodes["a"].ha.election.acceptor.restart_wait == 2.0
        assert nodes["a"].ha.election.proposer._req > first["a"]
        assert read_durable(tmp_path / "a" / "ha").boots == 2
        await wait_until(
            lambda: read_durable(tmp_path / "a" / "ha").longest_lease == 1.0,
            timeout=5, what="the longer lease forgotten after the restart wait",
        )  # fmt: skip


async def test_prometheus_shows_role_epoch_validity_and_transitions(tmp_path):
    from prometheus_client import generate_latest

    async with rack(tmp_path) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        active = nodes[actives(nodes)[0]]
        standby = next(n for n in nodes.values() if n is not active)
        await wait_until(lambda: active.ha.status()["renewals"] >= 4, what="four renewals")
        # renewed on schedule: each landed with most of the lease left
        assert active.ha.status()["lowest_left"] > 0.5
        text = generate_latest(active.metrics).decode()
        assert "rackboot_ha_renewals_total " in text
        assert 'rackboot_ha_role{role="active"} 1.0' in text
        assert 'rackboot_ha_transitions_total{kind="acquired"}' in text
        epoch = float(text.split("\nrackboot_ha_epoch ")[1].split()[0])
        assert epoch == active.ha.status()["epoch"] >= 1
        assert "rackboot_ha_valid_seconds " in text and "rackboot_ha_refusals" in text
        other = generate_latest(standby.metrics).decode()
        assert 'rackboot_ha_role{role="standby"} 1.0' in other
        assert "\nrackboot_ha_epoch 0.0" in other
