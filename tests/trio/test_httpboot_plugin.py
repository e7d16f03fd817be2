"""The httpboot plugin in a node (real loopback sockets, real clock, every test bounded):
configuration, scripts by profile, confinement with planted symlinks, the events API and
its tokens, admin auth, durability across a restart, status, metrics, hooks."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from appliance.api import Role, hookimpl
from appliance.config import validate
from appliance.errors import ConfigError, PluginError, RackbootError
from appliance.node import Node
from appliance.pluginmanager import collect_sections
from plugins.dhcp.plugin import DhcpPlugin
from plugins.httpboot.identity import machine_token
from plugins.httpboot.messages import Response, Route
from plugins.httpboot.plugin import HttpBootPlugin
from tests.support.http import fetch
from tests.support.plugins import configured

LIMIT = 20
MAC = "52:54:00:12:34:56"
ADMIN = "a" * 40
SECRET = b"SECRET-OUTSIDE-THE-ROOT"
PROFILES = [
    {"name": "default", "kernel": "vmlinuz", "initrd": ["initrd.img"], "cmdline": "console=ttyS0"},
    {"name": "debian", "kernel": "debian/linux", "initrd": ["debian/initrd.gz"]},
    {"name": "local", "kernel": ""},
]


def settings(**extra) -> dict:
    return {"httpboot": {"port": 0, "profiles": PROFILES, **extra}, "dhcp": {"interfaces": []}}


@contextlib.asynccontextmanager
async def running(tmp_path: Path, document: dict, **plugins) -> AsyncIterator[tuple[Node, str]]:
    config, pm = configured(
        tmp_path, document, dhcp=DhcpPlugin(), httpboot=HttpBootPlugin(), **plugins
    )
    node = Node(config, pm)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        host, port = node.status()["httpboot"]["listening"][0].split(":")
        yield node, f"{host}:{port}"
        node.request_stop("test")


def address(listening: str) -> tuple[str, int]:
    host, port = listening.split(":")
    return host, int(port)


def event_body(stage="installed", status="ok", message="done") -> bytes:
    return json.dumps({"stage": stage, "status": status, "message": message}).encode()


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def test_development_and_production_defaults(tmp_path):
    config, pm = configured(tmp_path, httpboot=HttpBootPlugin())
    dev = config["httpboot"]
    assert (tuple(map(str, dev.addresses)), dev.port, dev.root) == (("127.0.0.1",), 8080, "")
    prod = validate("<test>", {}, collect_sections(pm), dev=False)["httpboot"]
    assert (tuple(map(str, prod.addresses)), prod.port, prod.root) == (
        ("0.0.0.0",), 80, "/srv/rackboot/http",
    )  # fmt: skip
    assert prod.admin_token == "" and prod.default_profile == "default"
    assert [p.name for p in prod.profiles] == ["default"]


@pytest.mark.parametrize(
    ("document", "keypath"),
    [
        ({"httpboot": {"default_profile": "nope"}}, "httpboot.default_profile"),
        ({"httpboot": {"profiles": [PROFILES[0], PROFILES[0]]}}, r"httpboot.profiles\[1\].name"),
        (
            {"httpboot": {"machines": [{"mac": MAC, "profile": "nope"}]}},
            r"httpboot.machines\[0\].profile",
        ),
        (
            {
                "httpboot": {
                    "machines": [
                        {"mac": MAC, "profile": "default"},
                        {"mac": MAC.replace(":", "-"), "profile": "default"},
                    ]
                }
            },
            r"httpboot.machines\[1\].mac",
        ),
        ({"httpboot": {"admin_token": "short"}}, "httpboot.admin_token"),
        (
            {"httpboot": {"profiles": [{"name": "x", "cmdline": "a\nb"}]}},
            r"httpboot.profiles\[0\].cmdline",
        ),
        (
            {"dhcp": {"reservations": [{"address": "127.0.100.5", "mac": MAC, "profile": "nope"}]}},
            r"dhcp.reservations\[0\].profile",
        ),
    ],
)
def test_configuration_errors_name_the_key(tmp_path, document, keypath):
    with pytest.raises(ConfigError, match=keypath):
        configured(tmp_path, document, dhcp=DhcpPlugin(), httpboot=HttpBootPlugin())


async def test_scripts_follow_the_machine_profile_and_the_address_asked(tmp_path):
    document = settings(machines=[{"mac": MAC, "profile": "debian"}])
    document["dhcp"]["reservations"] = [
        {"address": "127.0.100.5", "mac": "52:54:00:00:00:05", "profile": "local"}
    ]
    with trio.fail_after(LIMIT):
        async with running(tmp_path, document) as (node, listening):
            where = address(listening)
            base = f"http://{listening}"
            token = machine_token((tmp_path / "data" / "httpboot" / "secret").read_bytes(), MAC)
            debian = await fetch(where, "GET", "/boot/52-54-00-12-34-56.ipxe")
            assert debian.status == 200 and debian.header(b"cache-control") == b"no-store"
            assert debian.body.decode().splitlines() == [
                "#!ipxe",
                f"# rackboot machine {MAC} profile debian",
                f"kernel {base}/boot/debian/linux initrd=initrd.gz"
                f" rackboot.events={base}/api/v1/machines/52-54-00-12-34-56/events"
                f" rackboot.token={token}",
                f"initrd {base}/boot/debian/initrd.gz",
                "boot",
            ]
            same = await fetch(where, "GET", "/boot/52:54:00:12:34:56.ipxe")
            assert same.body == debian.body  # colons work too
            reserved = await fetch(where, "GET", "/boot/52-54-00-00-00-05.ipxe")
            assert b"profile local\nexit\n" in reserved.body  # the DHCP reservation's profile
            other = await fetch(where, "GET", "/boot/52-54-00-00-00-09.ipxe")
            assert (
                b"profile default" in other.body
                and b" console=ttyS0 rackboot.events=" in other.body
            )
            status = node.status()["httpboot"]
            assert status["scripts"] == {"debian": 2, "local": 1, "default": 1}


async def test_base_url_replaces_the_address_in_scripts(tmp_path):
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings(base_url="http://192.0.2.1:8080")) as (_, listening):
            script = (await fetch(address(listening), "GET", "/boot/52-54-00-12-34-56.ipxe")).body
            assert b"kernel http://192.0.2.1:8080/boot/vmlinuz " in script
            assert b"rackboot.events=http://192.0.2.1:8080/api/v1/machines/" in script


def plant(root: Path, outside: Path) -> None:
    """Boot files, and links a careless server follows out of its root (as nginx does with
    its default ``disable_symlinks off``; tests/real/test_httpboot_clients.py shows it)."""
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    (root / "ipxe.efi").write_bytes(b"MZ" + os.urandom(1000))
    (root / "sub" / "file.txt").write_bytes(b"inside")
    (root / "%2e%2e").write_bytes(b"a file literally named %2e%2e")
    (root / "escape").symlink_to(outside / "secret.txt")  # absolute, outside
    (root / "rel").symlink_to("../outside/secret.txt")  # relative, outside
    (root / "dirlink").symlink_to(outside)  # a directory outside
    (root / "sub" / "up").symlink_to("../../outside/secret.txt")  # two levels up
    (root / "rootlink").symlink_to("/")
    (root / "loop").symlink_to("loop")
    (root / "inside").symlink_to("sub/file.txt")  # stays inside: served


TRAVERSAL = [
    (b"/boot/escape", 403),
    (b"/boot/rel", 403),
    (b"/boot/dirlink/secret.txt", 403),
    (b"/boot/sub/up", 403),
    (b"/boot/rootlink/etc/passwd", 403),
    (b"/boot/loop", 403),
    (b"/boot/../outside/secret.txt", 403),
    (b"/boot/sub/../../outside/secret.txt", 403),
    (b"/boot/%2e%2e/outside/secret.txt", 403),
    (b"/boot/%2E%2E%2Foutside%2Fsecret.txt", 403),
    (b"/boot/..%2foutside%2fsecret.txt", 403),
    (b"/boot/%252e%252e/outside/secret.txt", 403),
    (b"/boot/..%5coutside%5csecret.txt", 403),
    (b"/boot/..\\outside\\secret.txt", 403),
    (b"/boot/sub%2f..%2f..%2foutside%2fsecret.txt", 403),
    (b"/boot//etc/passwd", 404),  # relative to the root: root/etc/passwd does not exist
    (b"/boot/%2e%2e", 403),  # decoded once, it is '..': never the literal file
    (b"/boot/escape%00.efi", 400),
    (b"/boot/sub", 403),  # a directory
    (b"/boot/", 404),  # no file named
    (b"/boot/nothing", 404),
    (b"/etc/passwd", 404),
    (b"/../../etc/passwd", 403),
    (b"http://evil/boot/../outside/secret.txt", 403),
]


@pytest.mark.parametrize(("target", "status"), TRAVERSAL)
async def test_traversal_is_refused_in_every_encoding(tmp_path, target, status):
    root, outside = tmp_path / "root", tmp_path / "outside"
    plant(root, outside)
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings(root=str(root))) as (_, listening):
            reply = await fetch(address(listening), "GET", target)
            assert reply.status == status
            assert SECRET not in reply.body
            for revealing in (str(root).encode(), str(tmp_path).encode(), b"outside/"):
                assert revealing not in reply.body
            inside = await fetch(address(listening), "GET", "/boot/inside")
            assert (inside.status, inside.body) == (200, b"inside")
            efi = await fetch(address(listening), "GET", "/boot/ipxe.efi")
            assert efi.header(b"content-type") == b"application/efi"


async def test_events_need_the_machines_own_token(tmp_path):
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings()) as (node, listening):
            where = address(listening)
            secret = (tmp_path / "data" / "httpboot" / "secret").read_bytes()
            assert (tmp_path / "data" / "httpboot" / "secret").stat().st_mode & 0o777 == 0o600
            token = machine_token(secret, MAC)
            url = "/api/v1/machines/52-54-00-12-34-56/events"
            missing = await fetch(where, "POST", url, body=event_body())
            assert (
                missing.status == 401
                and missing.header(b"www-authenticate") == b'Bearer realm="rackboot"'
            )
            wrong = await fetch(where, "POST", url, headers=bearer("0" * 32), body=event_body())
            assert wrong.status == 401
            someone_elses = machine_token(secret, "52:54:00:12:34:57")
            assert (
                await fetch(where, "POST", url, headers=bearer(someone_elses), body=event_body())
            ).status == 401
            bad = await fetch(
                where, "POST", url, headers=bearer(token), body=b'{"stage":"x","status":"maybe"}'
            )
            assert bad.status == 400 and b"status: expected one of" in bad.body
            huge = await fetch(where, "POST", url, headers=bearer(token), body=b" " * 5000)
            assert huge.status == 413
            first = await fetch(
                where, "POST", url, headers=bearer(token), body=event_body("started", "started", "")
            )
            done = await fetch(where, "POST", url, headers=bearer(token), body=event_body())
            assert first.status == done.status == 201
            recorded = json.loads(done.body)
            assert (recorded["mac"], recorded["seq"], recorded["stage"], recorded["client"]) == (
                MAC, 2, "installed", "127.0.0.1",
            )  # fmt: skip
            machine = json.loads(
                (await fetch(where, "GET", "/api/v1/machines/52:54:00:12:34:56")).body
            )
            assert (machine["stage"], machine["status"], machine["profile"]) == (
                "installed",
                "ok",
                "default",
            )
            assert [e["stage"] for e in machine["events"]] == ["started", "installed"]
            listed = json.loads((await fetch(where, "GET", "/api/v1/machines")).body)["machines"]
            assert [(m["mac"], m["events"], m["stage"]) for m in listed] == [(MAC, 2, "installed")]
            unknown = json.loads(
                (await fetch(where, "GET", "/api/v1/machines/52-54-00-00-00-01")).body
            )
            assert unknown["events"] == [] and unknown["stage"] is None
            assert (await fetch(where, "GET", "/api/v1/machines/not-a-mac")).status == 404

            node.pm.hook.rackboot_role_changed(node=node, old=Role.ACTIVE, new=Role.STANDBY)
            standby = await fetch(where, "POST", url, headers=bearer(token), body=event_body())
            assert standby.status == 503 and standby.header(b"retry-after") == b"1"
            node.pm.hook.rackboot_role_changed(node=node, old=Role.STANDBY, new=Role.ACTIVE)

            refusals = node.status()["httpboot"]["event_refusals"]
            assert refusals == {
                "unauthorized": 3,
                "invalid": 1,
                "too-large": 0,
                "standby": 1,
                "not-durable": 0,
                "fenced": 0,
            }
            metrics = (await fetch(where, "GET", "/metrics")).body.decode()
            assert 'rackboot_http_events_total{status="ok"} 1.0' in metrics
            assert 'rackboot_http_event_refusals_total{reason="unauthorized"} 3.0' in metrics
            assert 'rackboot_http_requests_total{method="POST",status="201"} 2.0' in metrics
            status = json.loads((await fetch(where, "GET", "/api/v1/status")).body)
            assert (
                status["httpboot"]["machines_with_events"] == 1
                and status["core"]["role"] == "active"
            )


async def test_admin_routes_are_off_by_default_and_need_the_token(tmp_path):
    url = "/api/v1/machines/52-54-00-12-34-56/events"
    with trio.fail_after(LIMIT):
        async with running(tmp_path / "off", settings()) as (_, listening):
            off = await fetch(address(listening), "DELETE", url, headers=bearer(ADMIN))
            assert off.status == 403 and b"admin API disabled" in off.body
        async with running(tmp_path / "on", settings(admin_token=ADMIN)) as (_, listening):
            where = address(listening)
            token = machine_token(
                (tmp_path / "on" / "data" / "httpboot" / "secret").read_bytes(), MAC
            )
            for _ in range(3):
                await fetch(where, "POST", url, headers=bearer(token), body=event_body())
            assert (await fetch(where, "DELETE", url)).status == 401
            assert (await fetch(where, "DELETE", url, headers=bearer(token))).status == 401
            cleared = await fetch(where, "DELETE", url, headers=bearer(ADMIN))
            assert (cleared.status, json.loads(cleared.body)["cleared"]) == (200, 3)
            again = await fetch(where, "POST", url, headers=bearer(token), body=event_body())
            assert json.loads(again.body)["seq"] == 4  # the sequence never goes back


async def test_events_and_the_secret_survive_a_restart(tmp_path):
    url = "/api/v1/machines/52-54-00-12-34-56/events"
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings()) as (_, listening):
            script = (await fetch(address(listening), "GET", "/boot/52-54-00-12-34-56.ipxe")).body
            token = script.split(b"rackboot.token=")[1].split()[0].decode()
            for stage in ("partition", "install"):
                reply = await fetch(
                    address(listening), "POST", url, headers=bearer(token), body=event_body(stage)
                )
                assert reply.status == 201
        async with running(tmp_path, settings()) as (_, listening):
            where = address(listening)
            again = (await fetch(where, "GET", "/boot/52-54-00-12-34-56.ipxe")).body
            assert f"rackboot.token={token} ".encode() in again.replace(b"\n", b" ")
            machine = json.loads(
                (await fetch(where, "GET", "/api/v1/machines/52-54-00-12-34-56")).body
            )
            assert [e["stage"] for e in machine["events"]] == ["partition", "install"]
            reply = await fetch(
                where, "POST", url, headers=bearer(token), body=event_body("reboot")
            )
            assert json.loads(reply.body)["seq"] == 3


async def test_a_secret_others_can_read_stops_the_service(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o644)
    config, pm = configured(
        tmp_path, settings(secret_file=str(secret)), dhcp=DhcpPlugin(), httpboot=HttpBootPlugin()
    )
    with (
        trio.fail_after(LIMIT),
        pytest.raises(RackbootError, match="must be a regular file of mode 0600"),
    ):
        await Node(config, pm).run(handle_signals=False)


class Extension:
    """A plugin that adds a route, replaces one machine's script and watches events."""

    def __init__(self) -> None:
        self.events: list = []

    @hookimpl
    def httpboot_routes(self, node):
        async def inventory(request):
            await trio.sleep(0)
            return Response.json({"name": request.params["name"], "node": node.config.node.name})

        return [Route("GET", "/api/v1/inventory/{name}", inventory)]

    @hookimpl
    def httpboot_boot_script(self, machine, default):
        if machine.mac.endswith(":99"):
            raise RuntimeError("policy broken")
        if machine.mac.endswith(":42"):
            return "#!ipxe\nsanboot --no-describe --drive 0x80\n"
        return None

    @hookimpl
    def httpboot_machine_event(self, event):
        self.events.append(event)


async def test_hooks_add_routes_choose_scripts_and_see_events(tmp_path):
    extension = Extension()
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings(), ext=extension) as (_, listening):
            where = address(listening)
            added = await fetch(where, "GET", "/api/v1/inventory/rack1")
            assert json.loads(added.body) == {"name": "rack1", "node": "test-node"}
            chosen = await fetch(where, "GET", "/boot/52-54-00-00-00-42.ipxe")
            assert chosen.body == b"#!ipxe\nsanboot --no-describe --drive 0x80\n"
            broken = await fetch(where, "GET", "/boot/52-54-00-00-00-99.ipxe")
            assert broken.status == 500 and b"policy" not in broken.body  # never the default
            default = await fetch(where, "GET", "/boot/52-54-00-00-00-01.ipxe")
            assert b"kernel " in default.body
            token = default.body.split(b"rackboot.token=")[1].split()[0].decode()
            url = "/api/v1/machines/52-54-00-00-00-01/events"
            await fetch(where, "POST", url, headers=bearer(token), body=event_body())
            assert [(e.mac, e.stage) for e in extension.events] == [
                ("52:54:00:00:00:01", "installed")
            ]


class Conflicting:
    @hookimpl
    def httpboot_routes(self, node):
        return [Route("GET", "/metrics", lambda request: Response.text("mine"))]


async def test_a_route_taken_twice_stops_the_service_naming_it(tmp_path):
    config, pm = configured(
        tmp_path, settings(), dhcp=DhcpPlugin(), httpboot=HttpBootPlugin(), bad=Conflicting()
    )
    with trio.fail_after(LIMIT), pytest.raises(PluginError, match="GET /metrics is routed twice"):
        await Node(config, pm).run(handle_signals=False)
