"""Events tokens bound to the machine (bind_tokens_to_lease), pagination, status access.

A node on loopback with the binding on: the test writes DHCP leases into the state
log as the DHCP plugin does (namespace dhcp.leases, its own value format), and its
client connects from other loopback addresses (127.0.0.3, ...) to be the machine,
or not."""

from __future__ import annotations

import ipaddress
import json
import time

import trio

from plugins.dhcp.leases import NAMESPACE as LEASES_NS
from plugins.dhcp.leases import Lease, LeaseState, lease_value
from plugins.httpboot.events import EVENTS_NS
from plugins.httpboot.machines import MACHINES_NS
from tests.support.http import Client
from tests.trio.test_httpboot_plugin import (
    ADMIN,
    LIMIT,
    MAC,
    address,
    bearer,
    event_body,
    running,
    settings,
    token_of,
)

MACHINE_ADDRESS = "127.0.0.3"
SCRIPT = "/boot/52-54-00-12-34-56.ipxe"
EVENTS = "/api/v1/machines/52-54-00-12-34-56/events"


async def fetch_from(source: str, where, method: str, target: str, **kw):
    """One request from the loopback address ``source`` (the machine, or someone else)."""
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(where)
    client = Client(trio.SocketStream(sock))
    try:
        return await client.request(method, target, **kw)
    finally:
        await client.aclose()


async def lease(node, at: str, mac: str = MAC, *, starts: float | None = None,
                length: float = 3600.0, state: LeaseState = LeaseState.BOUND) -> None:  # fmt: skip
    """A DHCP lease committed in the rack's state, as the DHCP plugin writes it."""
    starts = time.time() if starts is None else starts
    record = Lease(int(ipaddress.IPv4Address(at)), b"\x01" + bytes.fromhex(mac.replace(":", "")),
                   bytes.fromhex(mac.replace(":", "")), "127.0.0.0/8", state, starts,
                   starts + length)  # fmt: skip
    await node.state.put(LEASES_NS, at, lease_value(record))


def bound(**extra) -> dict:
    """A configured node's defaults: tokens bound, status for the admin token only."""
    return settings(**{"bind_tokens_to_lease": True, "status_networks": [], "admin_token": ADMIN,
                       **extra})  # fmt: skip


async def test_a_script_and_its_token_go_only_to_the_address_of_the_machines_lease(tmp_path):
    with trio.fail_after(LIMIT):
        async with running(tmp_path, bound()) as (node, listening):
            where = address(listening)
            # nobody holds a lease of the MAC: 404 (an unknown machine), from anywhere
            assert (await fetch_from(MACHINE_ADDRESS, where, "GET", SCRIPT)).status == 404
            await lease(node, MACHINE_ADDRESS)
            script = await fetch_from(MACHINE_ADDRESS, where, "GET", SCRIPT)
            assert script.status == 200
            token = token_of(script.body)
            # a second fetch under the same lease: the same boot, the same token, no record
            position = node.state.position
            again = await fetch_from(MACHINE_ADDRESS, where, "GET", SCRIPT)
            assert token_of(again.body) == token and node.state.position == position
            # from another address: 403 (the machine is known), its token not given out
            other = await fetch_from("127.0.0.4", where, "GET", SCRIPT)
            assert other.status == 403 and token.encode() not in other.body
            # another MAC's lease does not speak for this one
            await lease(node, "127.0.0.5", "52:54:00:00:00:05")
            assert (await fetch_from("127.0.0.5", where, "GET", SCRIPT)).status == 403

            # events: from the machine's address with its token
            posted = await fetch_from(MACHINE_ADDRESS, where, "POST", EVENTS,
                                      headers=bearer(token), body=event_body())  # fmt: skip
            assert posted.status == 201
            elsewhere = await fetch_from("127.0.0.4", where, "POST", EVENTS,
                                         headers=bearer(token), body=event_body())  # fmt: skip
            assert elsewhere.status == 403

            # a new lease (the machine booted again): a new token, the old one refused
            await lease(node, MACHINE_ADDRESS, starts=time.time() + 1)
            fresh = token_of((await fetch_from(MACHINE_ADDRESS, where, "GET", SCRIPT)).body)
            assert fresh != token
            stale = await fetch_from(MACHINE_ADDRESS, where, "POST", EVENTS,
                                     headers=bearer(token), body=event_body())  # fmt: skip
            assert stale.status == 401
            # the installer's own DHCP client took another address for the same MAC: its
            # events come from there, with the boot's token
            await lease(node, "127.0.0.6")
            moved = await fetch_from("127.0.0.6", where, "POST", EVENTS,
                                     headers=bearer(fresh), body=event_body("done"))  # fmt: skip
            assert moved.status == 201

            # an expired or released lease speaks for nobody
            await lease(node, MACHINE_ADDRESS, starts=time.time() - 7200)
            assert (await fetch_from(MACHINE_ADDRESS, where, "GET", SCRIPT)).status == 403
            await lease(node, "127.0.0.6", state=LeaseState.RELEASED)
            late = await fetch_from("127.0.0.6", where, "POST", EVENTS,
                                    headers=bearer(fresh), body=event_body())  # fmt: skip
            assert late.status == 403

            status = node.status()["httpboot"]
            assert status["event_refusals"]["wrong-source"] == 2
            assert status["event_refusals"]["unauthorized"] == 1
            assert status["machines"]["refusals"] == {
                "script/unknown-machine": 1,
                "script/wrong-source": 3,
            }
            metrics = (await fetch_from(MACHINE_ADDRESS, where, "GET", "/metrics")).body.decode()
            assert (
                'rackboot_http_access_refusals_total{reason="wrong-source",route="script"} 3.0'
                in metrics
            )


async def test_forged_events_for_made_up_machines_are_refused_and_add_nothing(tmp_path):
    """The attack of issue 16: tokens for any MAC, then events for made-up MACs. No script
    is given to an address that holds no lease, and an event of a MAC that never booted
    here is 404: nothing is written, the table does not grow."""
    with trio.fail_after(LIMIT):
        async with running(tmp_path, bound()) as (node, listening):
            where = address(listening)
            await lease(node, MACHINE_ADDRESS)  # one real machine, elsewhere
            position = node.state.position
            for n in range(50):
                mac = f"52-54-00-aa-00-{n:02x}"
                script = await fetch_from("127.0.0.4", where, "GET", f"/boot/{mac}.ipxe")
                assert script.status == 404 and b"rackboot.token" not in script.body
                forged = await fetch_from("127.0.0.4", where, "POST",
                                          f"/api/v1/machines/{mac}/events",
                                          headers=bearer("0" * 32), body=event_body())  # fmt: skip
                assert forged.status == 404
            assert node.state.position == position  # not a record written
            assert list(node.state.scan(EVENTS_NS)) == list(node.state.scan(MACHINES_NS)) == []
            status = node.status()["httpboot"]
            assert status["event_refusals"]["unknown-machine"] == 50
            assert status["machines"]["refusals"] == {"script/unknown-machine": 50}


async def test_a_reservation_speaks_for_its_machine(tmp_path):
    document = bound()
    document["dhcp"]["reservations"] = [{"address": "127.0.100.5", "mac": MAC}]
    with trio.fail_after(LIMIT):
        async with running(tmp_path, document) as (node, listening):
            where = address(listening)
            script = await fetch_from("127.0.100.5", where, "GET", SCRIPT)
            assert script.status == 200
            reply = await fetch_from("127.0.100.5", where, "POST", EVENTS,
                                     headers=bearer(token_of(script.body)), body=event_body())  # fmt: skip
            assert reply.status == 201
            # known (reserved), so another address gets 403, not 404
            assert (await fetch_from("127.0.0.4", where, "GET", SCRIPT)).status == 403


async def test_machines_come_in_pages(tmp_path):
    """Binding off (the development default): any address fetches scripts."""
    macs = [f"52:54:00:00:01:{n:02x}" for n in range(7)]
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings()) as (_, listening):
            where = address(listening)
            for mac in reversed(macs):
                script = await fetch_from("127.0.0.1", where, "GET", f"/boot/{mac}.ipxe")
                url = f"/api/v1/machines/{mac}/events"
                reply = await fetch_from("127.0.0.1", where, "POST", url,
                                         headers=bearer(token_of(script.body)), body=event_body())  # fmt: skip
                assert reply.status == 201
            seen, after, pages = [], "", 0
            while True:
                page = json.loads(
                    (
                        await fetch_from(
                            "127.0.0.1", where, "GET", f"/api/v1/machines?limit=3{after}"
                        )
                    ).body
                )
                pages += 1
                seen += [row["mac"] for row in page["machines"]]
                if page["next"] is None:
                    break
                after = f"&after={page['next']}"
            assert seen == macs and pages == 3
            default = json.loads(
                (await fetch_from("127.0.0.1", where, "GET", "/api/v1/machines")).body
            )
            assert (default["limit"], default["next"], len(default["machines"])) == (100, None, 7)
            dashed = json.loads(
                (
                    await fetch_from(
                        "127.0.0.1", where, "GET", "/api/v1/machines?after=52-54-00-00-01-04"
                    )
                ).body
            )
            assert [row["mac"] for row in dashed["machines"]] == macs[5:]
            for bad in ("limit=0", "limit=1001", "limit=x", "after=nope", "limit=2&limit=3",
                        "offset=3", "limit=%33", "limit"):  # fmt: skip
                reply = await fetch_from("127.0.0.1", where, "GET", f"/api/v1/machines?{bad}")
                assert reply.status == 400, bad


async def test_status_needs_the_admin_token_or_an_allowed_network(tmp_path):
    with trio.fail_after(LIMIT):
        async with running(tmp_path / "token", bound(status_networks=["127.0.0.64/26"])) as (
            _, listening,
        ):  # fmt: skip
            where = address(listening)
            stranger = await fetch_from("127.0.0.4", where, "GET", "/api/v1/status")
            assert stranger.status == 401 and stranger.header(b"www-authenticate")
            assert str(tmp_path).encode() not in stranger.body and b"pid" not in stranger.body
            wrong = await fetch_from("127.0.0.4", where, "GET", "/api/v1/status",
                                     headers=bearer("b" * 40))  # fmt: skip
            assert wrong.status == 401
            admin = await fetch_from("127.0.0.4", where, "GET", "/api/v1/status",
                                     headers=bearer(ADMIN))  # fmt: skip
            assert admin.status == 200 and json.loads(admin.body)["httpboot"]["serving"]
            allowed = await fetch_from("127.0.0.65", where, "GET", "/api/v1/status")
            assert allowed.status == 200
            metrics = await fetch_from("127.0.0.4", where, "GET", "/metrics")  # open to scrapers
            assert metrics.status == 200
            assert (
                'rackboot_http_access_refusals_total{reason="unauthorized",route="status"} 2.0'
                in metrics.body.decode()
            )
        no_admin = settings(bind_tokens_to_lease=True, status_networks=[])
        async with running(tmp_path / "none", no_admin) as (_, listening):
            refused = await fetch_from("127.0.0.1", address(listening), "GET", "/api/v1/status",
                                       headers=bearer(ADMIN))  # fmt: skip
            assert refused.status == 403 and b"admin_token" in refused.body


async def test_status_is_strict_json(tmp_path):
    """A standalone node's lease never ends (inf in its status): null in the JSON."""
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings()) as (node, listening):
            reply = await fetch_from("127.0.0.1", address(listening), "GET", "/api/v1/status")

            def refuse(constant: str) -> None:
                raise ValueError(f"not strict JSON: {constant}")

            document = json.loads(reply.body, parse_constant=refuse)
            assert document["core"]["role"] == "active"
