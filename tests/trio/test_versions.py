"""Nodes that claim different versions (appliance/compat.py), over real loopback links:
compatible ones work together (requests between appliances only from cluster protocol 2
on), incompatible ones are refused on each channel with a message naming both versions,
shown in status."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from appliance.compat import THIS, Range
from appliance.errors import RackbootError
from tests.support.ha import free_udp_ports
from tests.trio.test_cluster import online, running, site, wait_until
from tests.trio.test_ha import actives, rack


def claims(version: str, **ranges) -> object:
    return dataclasses.replace(
        THIS, version=version, **{k: Range(*v) if isinstance(v, tuple) else v
                                  for k, v in ranges.items()}
    )  # fmt: skip


async def test_requests_between_members_and_the_versions_that_cannot_take_them(tmp_path):
    with trio.fail_after(40):
        async with running(tmp_path, "alpha") as a:
            token = (await a.cluster.cmd_init({}))["token"]
            port = free_udp_ports(1)[0] + 1  # TCP: beta answers at one address throughout
            async with running(tmp_path, "beta", claims("0.3.0"), port=port) as b:
                joined = await b.cluster.cmd_join({"token": token})
                beta = joined["node_id"]
                await wait_until(lambda: online(a, "beta") and online(b, "alpha"), what="link")

                async def echo(caller, args):
                    if args.get("fail"):
                        raise RackbootError("asked to fail")
                    return {"caller": caller, "args": args}

                b.cluster.handlers["echo"] = echo
                got = await a.cluster.call(beta, "echo", {"x": [1, b"\x00"]})
                assert got == {"caller": a.cluster.identity.node_id, "args": {"x": [1, b"\x00"]}}
                with pytest.raises(RackbootError, match=f"{beta}: asked to fail"):
                    await a.cluster.call(beta, "echo", {"fail": True})
                with pytest.raises(RackbootError, match="takes no request 'nope'"):
                    await a.cluster.call(beta, "nope", {})
                assert site(a)["beta"]["version"] == "0.3.0"  # different, compatible
            # beta back as an older appliance: linked, but it takes no requests
            async with running(tmp_path, "beta", claims("0.0.9", cluster=(1, 1)), port=port):
                await wait_until(lambda: online(a, "beta"), what="relink")
                assert site(a)["beta"]["version"] == "0.0.9"
                with pytest.raises(RackbootError, match=r"rackboot 0.0.9 \(cluster protocol 1\), "
                                   "which takes no requests"):  # fmt: skip
                    await a.cluster.call(beta, "echo", {})
            # beta back speaking only a future protocol: refused, the reason in the site table
            async with running(tmp_path, "beta", claims("9.0", cluster=(7, 8)), port=port):
                await wait_until(
                    lambda: "incompatible cluster protocol" in site(a)["beta"]["reason"],
                    what="the refusal in status",
                )
                reason = site(a)["beta"]["reason"]
                assert "rackboot 9.0 (cluster protocol 7-8)" in reason
                assert f"rackboot {THIS.version} (cluster protocol 1-2)" in reason
                assert not online(a, "beta")


async def test_a_rack_whose_appliances_run_different_compatible_versions_works(tmp_path):
    newer = claims("0.9.0", election=(1, 2), replication=(1, 3), log=(1, 2))
    async with rack(tmp_path, speaks={"b": newer}) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        active = nodes[actives(nodes)[0]]
        standby = next(n for n in nodes.values() if n is not active)
        await wait_until(lambda: active.replication.followers, what="the standby to follow")
        await active.state.put("leases", "10.0.0.1", {"n": 1})
        await wait_until(lambda: standby.state.get("leases", "10.0.0.1") == {"n": 1},
                         what="the record on the standby")  # fmt: skip
        seen = active.ha.status()["transport"]["versions"]
        other = standby.cluster.identity.node_id
        assert seen[other]["version"] == standby.speaks.version and not seen[other]["problem"]
        (row,) = active.replication.status()["followers"].values()
        assert row["version"] == standby.speaks.version


async def test_an_appliance_with_no_election_protocol_in_common_is_refused(tmp_path):
    future = claims("7.0", election=(5, 5))
    async with rack(tmp_path, speaks={"b": future}) as (nodes, _):
        a, b = nodes["a"], nodes["b"]
        a_id, b_id = (n.cluster.identity.node_id for n in (a, b))
        await wait_until(lambda: a.ha.status()["transport"]["dropped"]["incompatible"] > 0
                         and b.ha.status()["transport"]["dropped"]["incompatible"] > 0,
                         what="each refusing the other's datagrams")  # fmt: skip
        problem = a.ha.status()["transport"]["versions"][b_id]["problem"]
        assert f"node {b_id} runs rackboot 7.0 (election protocol 5)" in problem
        assert "update this node to a version that speaks election protocol 5" in problem
        there = b.ha.status()["transport"]["versions"][a_id]["problem"]
        assert f"update node {a_id} to a version that speaks election protocol 5" in there
        from appliance.ha.plugin import render_status

        assert f"refused {b_id}: incompatible election protocol" in render_status(a.ha.status())
        # a never saw b's membership: a new rack with it takes no lease (docs/ha.md)
        assert actives(nodes) == []
        assert a.ha.status()["election"]["membership"]["blocked"] == "unconfirmed"


async def test_an_appliance_with_no_replication_protocol_in_common_follows_nobody(tmp_path):
    future = claims("7.0", replication=(5, 6), log=(3, 3), log_writes=3)
    async with rack(tmp_path, speaks={"b": future}) as (nodes, _):
        await wait_until(lambda: len(actives(nodes)) == 1, what="one active")
        active = nodes[actives(nodes)[0]]
        standby = next(n for n in nodes.values() if n is not active)
        peer = standby.cluster.identity.node_id
        await wait_until(lambda: peer in active.replication.status()["problems"], what="refusal")
        told = active.replication.status()["problems"][peer]
        assert "incompatible replication protocol" in told and "rackboot 7.0" in told
        await wait_until(lambda: standby.replication.status()["problems"], what="the standby told")
        assert "rackboot 7.0" in next(iter(standby.replication.status()["problems"].values()))
        with trio.fail_after(5):  # committed without it, once declared ineligible
            await active.state.put("leases", "10.0.0.1", {"n": 1})
        assert standby.state.get("leases", "10.0.0.1") is None  # nothing sent to misread
