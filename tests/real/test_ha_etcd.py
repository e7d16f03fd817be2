"""The etcd backend against a real etcd (Debian etcd-server) started on loopback:
one active with the leader key's create_revision as its epoch, hand-over on stop,
a vanished lease, a deleted or overwritten key step the holder down, and a dead
etcd takes the lease away."""

from __future__ import annotations

import base64
import shutil
import signal
import subprocess
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from appliance.api import Role
from appliance.ha.etcd import post_json
from appliance.node import Node
from tests.support.ha import free_udp_ports
from tests.support.plugins import configured

pytestmark = pytest.mark.skipif(not shutil.which("etcd"), reason="needs etcd (etcd-server)")


@pytest.fixture
def etcd(tmp_path: Path):
    client, peer = free_udp_ports(2)  # free as TCP ports too, in practice, on loopback
    url = f"http://127.0.0.1:{client}"
    log = (tmp_path / "etcd.log").open("w")
    proc = subprocess.Popen(
        ["etcd", "--name", "t", "--data-dir", str(tmp_path / "etcd"),
         "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"t=http://127.0.0.1:{peer}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc, client
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
        log.close()


async def wait_until(predicate, timeout: float, what: str) -> None:
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.02)
        return
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


async def etcd_up(port: int) -> None:
    with trio.fail_after(20):
        while True:
            try:
                await post_json("127.0.0.1", port, "/v3/kv/range", {"key": "eA=="})
                return
            except (OSError, ValueError):
                await trio.sleep(0.1)


@asynccontextmanager
async def nodes(tmp_path: Path, port: int):
    ha = {"backend": "etcd", "etcd_endpoints": [f"http://127.0.0.1:{port}"]}
    async with trio.open_nursery() as nursery:
        running = {}
        for name in ("a", "b"):
            config, pm = configured(
                tmp_path, {"node": {"name": name, "data_dir": str(tmp_path / name)}, "ha": ha}
            )
            node = Node(config, pm)
            running[name] = node
            await nursery.start(
                lambda task_status, node=node: node.run(
                    handle_signals=False, task_status=task_status
                )
            )
        yield running
        nursery.cancel_scope.cancel()


def actives(running) -> list[str]:
    return [n for n, node in running.items() if node.role is Role.ACTIVE]


KEY = base64.b64encode(b"/rackboot/leader/rack1").decode()
RENEW = 0.25  # the default [ha] renew; etcd grants a 2 s TTL


async def leader(port: int) -> dict:
    answer = await post_json("127.0.0.1", port, "/v3/kv/range", {"key": KEY})
    return (answer.get("kvs") or [{}])[0]


async def step_down_after(node, change) -> float:
    """Seconds from ``change`` (an awaitable on etcd) to ``node`` stepping down."""
    await change
    start = trio.current_time()
    await wait_until(lambda: node.ha.transitions["lost"] == 1, 2, "the step-down")
    return trio.current_time() - start


async def stays(predicate, seconds: float, what: str) -> None:
    with trio.move_on_after(seconds):
        while predicate():
            await trio.sleep(0.02)
        pytest.fail(f"no longer {what}")


async def test_one_active_and_its_epoch_is_the_keys_create_revision(tmp_path, etcd):
    _, port = etcd
    await etcd_up(port)
    async with nodes(tmp_path, port) as running:
        await wait_until(lambda: len(actives(running)) == 1, 10, "one active")
        holder = actives(running)[0]
        kv = await leader(port)
        assert base64.b64decode(kv["value"]).decode() == holder
        assert running[holder].ha.status()["epoch"] == int(kv["create_revision"])
        await trio.sleep(3)  # keepalives keep it past the 2 s TTL
        assert actives(running) == [holder]
        # demote: the lease is revoked, the other takes the key at its next look
        running[holder].ha.demote({})
        other = "b" if holder == "a" else "a"
        await wait_until(lambda: actives(running) == [other], 3, "the other to take over")
        assert running[other].ha.status()["epoch"] > int(kv["create_revision"])


async def test_a_vanished_lease_steps_the_holder_down(tmp_path, etcd):
    _, port = etcd
    await etcd_up(port)
    async with nodes(tmp_path, port) as running:
        await wait_until(lambda: len(actives(running)) == 1, 10, "one active")
        holder = actives(running)[0]
        kv = await leader(port)
        await post_json("127.0.0.1", port, "/v3/lease/revoke", {"ID": kv["lease"]})
        await wait_until(lambda: running[holder].ha.transitions["lost"] == 1, 2, "the step-down")
        await wait_until(lambda: len(actives(running)) == 1, 5, "a new holder")
        new = running[actives(running)[0]]
        assert new.ha.status()["epoch"] > int(kv["create_revision"])


async def test_without_etcd_the_holder_stops_before_its_validity_ends(tmp_path, etcd):
    proc, port = etcd
    await etcd_up(port)
    async with nodes(tmp_path, port) as running:
        await wait_until(lambda: len(actives(running)) == 1, 10, "one active")
        holder = running[actives(running)[0]]
        proc.send_signal(signal.SIGSTOP)  # etcd answers nothing
        try:
            stopped = trio.current_time()
            await wait_until(lambda: holder.role is Role.STANDBY, 4, "the step-down")
            assert trio.current_time() - stopped < 2.0  # the TTL etcd granted
            assert not holder.fence.ok()
        finally:
            proc.send_signal(signal.SIGCONT)


async def test_a_deleted_key_steps_the_holder_down_within_a_renew(tmp_path, etcd):
    _, port = etcd
    await etcd_up(port)
    async with nodes(tmp_path, port) as running:
        await wait_until(lambda: len(actives(running)) == 1, 10, "one active")
        holder = running[actives(running)[0]]
        kv = await leader(port)
        took = await step_down_after(holder, post_json("127.0.0.1", port, "/v3/kv/deleterange",
                                                       {"key": KEY}))  # fmt: skip
        assert took < 2 * RENEW  # its lease would have lasted another ~2 s
        assert "key-lost" in holder.ha.status()["last_change"]
        await wait_until(lambda: len(actives(running)) == 1, 3, "a new holder")
        new = running[actives(running)[0]]
        assert new.ha.status()["epoch"] == int((await leader(port))["create_revision"])
        assert new.ha.status()["epoch"] > int(kv["create_revision"])
        await stays(lambda: len(actives(running)) == 1, 2.5, "exactly one active")


async def test_a_key_overwritten_without_the_lease_steps_the_holder_down(tmp_path, etcd):
    _, port = etcd
    await etcd_up(port)
    async with nodes(tmp_path, port) as running:
        await wait_until(lambda: len(actives(running)) == 1, 10, "one active")
        name = actives(running)[0]
        holder = running[name]
        kv = await leader(port)
        # same value and create_revision, but no lease: only the LEASE compare differs
        put = post_json("127.0.0.1", port, "/v3/kv/put", {"key": KEY, "value": kv["value"]})
        assert await step_down_after(holder, put) < 2 * RENEW
        election = holder.ha.status()["election"]
        assert (election["last_refusal"], election["holder_seen"]) == ("key-lost", name)
        leases = await post_json("127.0.0.1", port, "/v3/lease/leases", {})
        assert kv["lease"] not in [lease["ID"] for lease in leases.get("leases", [])]  # revoked
        await stays(lambda: not actives(running), 1.0, "no active while the key is someone's")


async def test_a_node_taking_the_key_after_its_deletion_is_the_only_active(tmp_path, etcd):
    _, port = etcd
    await etcd_up(port)
    async with nodes(tmp_path, port) as running:
        await wait_until(lambda: len(actives(running)) == 1, 10, "one active")
        name = actives(running)[0]
        other = "b" if name == "a" else "a"
        await post_json("127.0.0.1", port, "/v3/kv/deleterange", {"key": KEY})
        running[other].ha.promote({})  # reads the key now, before the holder's next check
        await wait_until(lambda: actives(running) == [other], 2, "the other alone")
        assert (await leader(port))["value"] == base64.b64encode(other.encode()).decode()
        assert "key-lost" in running[name].ha.status()["last_change"]
        await stays(lambda: actives(running) == [other], 2.5, "the other alone")
