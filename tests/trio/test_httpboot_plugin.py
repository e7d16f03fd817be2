"""The httpboot plugin in a node (real loopback sockets, real clock, every test bounded):
configuration, scripts by profile, confinement with planted symlinks, the events API and
its tokens, admin auth, events and the secret in the state log across a restart, the lease
lost before an event commits, the import of an earlier release's files, status, metrics,
hooks."""

from __future__ import annotations

import contextlib
import inspect
import json
import math
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
from plugins.httpboot.events import EVENTS_NS, Cleared, Event, encode_record
from plugins.httpboot.identity import machine_token
from plugins.httpboot.machines import MACHINES_NS, Machines
from plugins.httpboot.messages import Response, Route
from plugins.httpboot.plugin import HttpBootPlugin
from plugins.httpboot.store import SECRET_KEY, SECRET_NS, Secret
from tests.support.http import fetch
from tests.support.plugins import configured
from tests.trio.test_cluster import wait_until

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
        await wait_until(lambda: settled(node), what="the secret and the import")
        yield node, f"{host}:{port}"
        node.request_stop("test")


def settled(node: Node) -> bool:
    """An active node's duties are done: the secret is in the state, an old journal read."""
    status = node.status()["httpboot"]
    return status["secret"] == "present" and status["journal"]["outcome"] != "pending"


def rack_secret(node: Node) -> bytes:
    secret = Secret(node.state)()
    assert secret is not None
    return secret


def address(listening: str) -> tuple[str, int]:
    host, port = listening.split(":")
    return host, int(port)


def builtin_routes(tmp_path: Path, **overrides):
    """The built-in routes over a real state store of their own (not started), outside a
    node: for the routes' decisions one by one."""
    from appliance.ha.fence import Fence
    from appliance.state.store import StateStore
    from plugins.httpboot.routes import BootPolicy, BuiltinRoutes
    from plugins.httpboot.script import Profile
    from plugins.httpboot.stats import Stats
    from plugins.httpboot.store import EventStore

    state = StateStore(tmp_path / "state", Fence(trio.current_time))
    state.load()
    machines = Machines(state, reservations={}, bind=False)
    arguments = dict(
        root=tmp_path, policy=BootPolicy({"default": Profile("default", "vmlinuz", (), "")}, {},
                                         "default"),
        secret=Secret(state), store=EventStore(state, 16), stats=Stats(), public_url="",
        admin_token="", max_event_bytes=4096, is_active=lambda: True, status=dict,
        metrics=None, script_hook=lambda **kw: None, event_hook=lambda event: None,
        machines=machines,
    )  # fmt: skip
    return BuiltinRoutes(**{**arguments, **overrides})


def token_of(script: bytes) -> str:
    return script.split(b"rackboot.token=")[1].split()[0].decode()


async def booted(where: tuple[str, int], mac: str = MAC) -> str:
    """The events token of a new boot of ``mac``: its script fetched."""
    script = await fetch(where, "GET", f"/boot/{mac.replace(':', '-')}.ipxe")
    assert script.status == 200, script
    return token_of(script.body)


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
    # tokens bound to the machine's lease, status for the admin token only; the dev node
    # (no DHCP, loopback only) serves any MAC's script and its status to local callers
    assert (prod.bind_tokens_to_lease, tuple(prod.status_networks)) == (True, ())
    assert (dev.bind_tokens_to_lease, tuple(map(str, dev.status_networks))) == (
        False, ("127.0.0.0/8",),
    )  # fmt: skip
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
            debian = await fetch(where, "GET", "/boot/52-54-00-12-34-56.ipxe")
            assert debian.status == 200 and debian.header(b"cache-control") == b"no-store"
            token = token_of(debian.body)
            nonce = node.state.get(MACHINES_NS, MAC)["nonce"]
            assert token == machine_token(rack_secret(node), MAC, nonce)
            assert debian.body.decode().splitlines() == [
                "#!ipxe",
                f"# rackboot machine {MAC} profile debian",
                f"kernel {base}/boot/debian/linux initrd=initrd.gz"
                f" rackboot.events={base}/api/v1/machines/52-54-00-12-34-56/events"
                f" rackboot.token={token}",
                f"initrd {base}/boot/debian/initrd.gz",
                "boot",
            ]
            same = await fetch(where, "GET", "/boot/52:54:00:12:34:56.ipxe")  # colons work too
            # without a lease to tell a second fetch from a new boot, each is a new boot
            assert token_of(same.body) != token
            assert same.body.replace(token_of(same.body).encode(), b"") == debian.body.replace(
                token.encode(), b""
            )
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
            secret = rack_secret(node)
            assert len(secret) == 32 and not (tmp_path / "data" / "httpboot" / "secret").exists()
            assert node.state.get(SECRET_NS, SECRET_KEY)["origin"] == "created"
            url = "/api/v1/machines/52-54-00-12-34-56/events"
            never_booted = await fetch(
                where, "POST", url, headers=bearer("0" * 32), body=event_body()
            )
            assert never_booted.status == 404 and b"no boot of this machine" in never_booted.body
            token = await booted(where)
            missing = await fetch(where, "POST", url, body=event_body())
            assert (
                missing.status == 401
                and missing.header(b"www-authenticate") == b'Bearer realm="rackboot"'
            )
            wrong = await fetch(where, "POST", url, headers=bearer("0" * 32), body=event_body())
            assert wrong.status == 401
            someone_elses = await booted(where, "52:54:00:12:34:57")
            assert (
                await fetch(where, "POST", url, headers=bearer(someone_elses), body=event_body())
            ).status == 401
            v1 = machine_token(secret, MAC, "")  # what a token without a boot would be
            assert (
                await fetch(where, "POST", url, headers=bearer(v1), body=event_body())
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
            listed = json.loads((await fetch(where, "GET", "/api/v1/machines")).body)
            assert [(m["mac"], m["events"], m["stage"]) for m in listed["machines"]] == [
                (MAC, 2, "installed")
            ]
            assert (listed["limit"], listed["next"]) == (100, None)
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
                "unknown-machine": 1,
                "unauthorized": 4,
                "invalid": 1,
                "too-large": 0,
                "standby": 1,
                "not-durable": 0,
                "fenced": 0,
                "no-secret": 0,
            }
            metrics = (await fetch(where, "GET", "/metrics")).body.decode()
            assert 'rackboot_http_events_total{status="ok"} 1.0' in metrics
            assert 'rackboot_http_event_refusals_total{reason="unauthorized"} 4.0' in metrics
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
        async with running(tmp_path / "on", settings(admin_token=ADMIN)) as (node, listening):
            where = address(listening)
            token = await booted(where)
            for _ in range(3):
                await fetch(where, "POST", url, headers=bearer(token), body=event_body())
            assert (await fetch(where, "DELETE", url)).status == 401
            assert (await fetch(where, "DELETE", url, headers=bearer(token))).status == 401
            cleared = await fetch(where, "DELETE", url, headers=bearer(ADMIN))
            assert (cleared.status, json.loads(cleared.body)["cleared"]) == (200, 3)
            again = await fetch(where, "POST", url, headers=bearer(token), body=event_body())
            assert json.loads(again.body)["seq"] == 4  # the sequence never goes back
            # the clearing is a marker record, and the cleared events are deleted records
            await wait_until(lambda: len(list(node.state.scan(EVENTS_NS))) == 2)
            assert dict(node.state.scan(EVENTS_NS))[f"{MAC}/cleared"] == {"seq": 3}


async def test_events_and_the_secret_survive_a_restart_in_the_state_log(tmp_path):
    """Each event is a record of the state log under its own key, the secret one too; no
    file of the plugin's own holds either."""
    url = "/api/v1/machines/52-54-00-12-34-56/events"
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings()) as (node, listening):
            script = (await fetch(address(listening), "GET", "/boot/52-54-00-12-34-56.ipxe")).body
            token = script.split(b"rackboot.token=")[1].split()[0].decode()
            for stage in ("partition", "install"):
                reply = await fetch(
                    address(listening), "POST", url, headers=bearer(token), body=event_body(stage)
                )
                assert reply.status == 201
            keys = [key for key, _ in node.state.scan(EVENTS_NS)]
            assert keys == [f"{MAC}/0000000001", f"{MAC}/0000000002"]
        assert sorted(p.name for p in (tmp_path / "data" / "httpboot").iterdir()) == ["root"]
        async with running(tmp_path, settings()) as (node, listening):
            where = address(listening)
            machine = json.loads(
                (await fetch(where, "GET", "/api/v1/machines/52-54-00-12-34-56")).body
            )
            assert [e["stage"] for e in machine["events"]] == ["partition", "install"]
            # the boot and its token are in the state log too: good across the restart
            reply = await fetch(
                where, "POST", url, headers=bearer(token), body=event_body("reboot")
            )
            assert json.loads(reply.body)["seq"] == 3
            # the next boot has a new token; the last one's is refused from then on
            again = await booted(where)
            assert again != token
            stale = await fetch(where, "POST", url, headers=bearer(token), body=event_body())
            assert stale.status == 401


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


class Observer:
    """A plugin that watches files served (optionalhook: it loads without httpboot too)
    and serves one image-like file of its own; ``broken`` makes the hook raise."""

    def __init__(self, image: Path) -> None:
        self.image, self.seen, self.broken = image, [], False

    @hookimpl(optionalhook=True)
    def httpboot_file_served(self, path, client):
        self.seen.append((path, client))
        if self.broken:
            raise RuntimeError("observer broken")

    @hookimpl
    def httpboot_routes(self, node):
        def image(request):
            handle = open(self.image, "rb")  # noqa: SIM115 (the server closes it)
            return Response.file(handle, os.fstat(handle.fileno()))

        return [Route("GET", "/images/{name}", image)]


async def test_a_file_served_is_announced_once_its_head_left(tmp_path):
    observer = Observer(tmp_path / "image.bin")
    observer.image.write_bytes(b"i" * 100)
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings(), obs=observer) as (node, listening):
            where, root = address(listening), Path(node.status()["httpboot"]["root"])
            (root / "vmlinuz").write_bytes(b"k" * 1000)
            (root / "debian").mkdir()
            (root / "debian" / "initrd big.gz").write_bytes(os.urandom(1 << 20))  # sendfile
            assert (await fetch(where, "GET", "/boot/vmlinuz")).status == 200
            assert (await fetch(where, "HEAD", "/boot/vmlinuz")).status == 200
            assert (await fetch(where, "GET", "/boot/missing")).status == 404
            assert (await fetch(where, "GET", "/boot/../etc/passwd")).status in (400, 403, 404)
            etag = (await fetch(where, "HEAD", "/boot/vmlinuz")).header(b"etag")
            revalidated = await fetch(where, "GET", "/boot/vmlinuz",
                                      headers=[("if-none-match", etag.decode())])  # fmt: skip
            assert revalidated.status == 304
            ranged = await fetch(where, "GET", "/boot/vmlinuz", headers=[("range", "bytes=0-9")])
            assert ranged.status == 206
            refused = await fetch(where, "GET", "/boot/vmlinuz", headers=[("range", "bytes=5000-")])
            assert refused.status == 416
            assert len((await fetch(where, "GET", "/boot/debian/initrd%20big.gz")).body) == 1 << 20
            assert (await fetch(where, "GET", "/images/base")).body == b"i" * 100
            await fetch(where, "GET", "/metrics")  # not a file
            client = where[0]
            assert observer.seen == [("vmlinuz", client), ("vmlinuz", client),
                                     ("debian/initrd big.gz", client), ("images/base", client)]  # fmt: skip
            observer.broken = True
            assert (await fetch(where, "GET", "/boot/vmlinuz")).body == b"k" * 1000
            assert observer.seen[-1] == ("vmlinuz", client)


async def test_nobody_listening_for_files_served_costs_no_call(tmp_path):
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings()) as (node, _):
            assert node.pm.get_plugin("httpboot").service.server.file_served is None


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


# -- the state log: the lease lost before an event commits, a standby without the secret,
# -- the import of an earlier release's files --------------------------------------------

EVENTS_URL = "/api/v1/machines/52-54-00-12-34-56/events"


class Held:
    """A commit policy that commits nothing past ``limit`` (a standby yet to acknowledge)."""

    def __init__(self) -> None:
        self.limit = 0

    def committable(self, durable: int) -> int:
        return min(durable, self.limit)


async def test_a_lease_lost_before_an_event_commits_gets_503_and_no_hook(tmp_path):
    """The event's record is on disk but waits for the standby's acknowledgement when the
    lease is lost: the installer gets 503 (it retries at the new active) and no plugin hears
    of the event. Back under the lease, the retry is recorded and announced once."""
    extension = Extension()
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings(), ext=extension) as (node, listening):
            where = address(listening)
            token = await booted(where)
            local, node.state.policy = node.state.policy, Held()
            replies = []

            async def post() -> None:
                reply = await fetch(where, "POST", EVENTS_URL, headers=bearer(token),
                                    body=event_body())  # fmt: skip
                replies.append(reply)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post)
                state = node.state
                await wait_until(lambda: len(state.uncommitted) == 1 and state.durable == state.last(),
                                 what="the event durable, not committed")  # fmt: skip
                node.set_role(Role.STANDBY)  # the lease lost: the fence closes first
                node.state.advance()
            assert replies[0].status == 503 and replies[0].header(b"retry-after") == b"1"
            assert extension.events == []
            assert node.status()["httpboot"]["event_refusals"]["fenced"] == 1
            node.state.policy = local
            node.set_role(Role.ACTIVE)
            again = await fetch(where, "POST", EVENTS_URL, headers=bearer(token), body=event_body())
            assert again.status == 201
            assert [event.seq for event in extension.events] == [json.loads(again.body)["seq"]]


async def test_a_node_without_the_secret_serves_no_script_and_takes_no_event(tmp_path):
    """A standby of a brand-new rack, before the active's secret reached it: it makes none
    up (a token of its own would be refused after a failover); scripts and events get 503."""
    from plugins.httpboot.messages import Request

    routes = builtin_routes(tmp_path, is_active=lambda: False)
    state, stats, fence = routes.store.state, routes.stats, routes.store.state.fence

    def request(method: str, path: str, **params: str) -> Request:
        return Request(method, path, b"", {b"authorization": b"Bearer " + b"0" * 32},
                       ("10.0.0.5", 1), ("10.0.0.1", 80), event_body(), params)  # fmt: skip

    script = await answered(routes.script(request("GET", "/boot/52-54-00-12-34-56.ipxe", mac=MAC)))
    assert script.status == 503 and (b"retry-after", b"1") in script.headers
    event = await routes.post_event(request("POST", EVENTS_URL, mac=MAC))
    assert event.status == 503 and stats.event_refusals["no-secret"] == 1
    assert stats.scripts_unavailable == 1
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            await nursery.start(state.run)
            fence.grant(math.inf, 1)
            await Secret(state).ensure(None, "a")  # what the active writes; replicated here
            # a new boot is the active's to record: a standby has no token to give yet
            standby = await answered(
                routes.script(request("GET", "/boot/52-54-00-12-34-56.ipxe", mac=MAC))
            )
            assert standby.status == 503 and routes.machines.refusals[("script", "standby")] == 1
            routes.is_active = lambda: True
            script = await answered(
                routes.script(request("GET", "/boot/52-54-00-12-34-56.ipxe", mac=MAC))
            )
            nursery.cancel_scope.cancel()
    assert script.status == 200
    nonce = state.get(MACHINES_NS, MAC)["nonce"]
    assert f"rackboot.token={machine_token(Secret(state)(), MAC, nonce)}".encode() in script.body


async def answered(result):
    """A handler's response: a plain one's as it is, an awaitable's once awaited (the script
    route answers at once unless a new boot must commit)."""
    return await result if inspect.isawaitable(result) else result


def plant_journal(path: Path, records: list) -> None:
    from appliance.journal import frame

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_bytes(b"".join(frame(encode_record(record)) for record in records))


async def test_an_earlier_releases_secret_and_journal_are_imported_once(tmp_path):
    """An upgraded active node: its secret file becomes the rack's secret (the tokens its
    installers hold stay good) and its events journal is imported (retention applied), then
    set aside. A journal found when the state already holds events is not imported."""
    directory = tmp_path / "data" / "httpboot"
    directory.mkdir(parents=True, mode=0o700)
    old = os.urandom(32)
    (directory / "secret").write_bytes(old)
    (directory / "secret").chmod(0o600)
    other = "52:54:00:00:00:02"
    plant_journal(directory / "events.journal", [
        *(Event(MAC, seq, 1.0e9 + seq, f"s{seq}", "progress", "", "10.0.0.5") for seq in (1, 2, 3)),
        Event(other, 1, 1.0e9, "started", "started"), Cleared(other, 4),
    ])  # fmt: skip
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings(retain_events=2)) as (node, listening):
            where = address(listening)
            assert rack_secret(node) == old
            assert node.state.get(SECRET_NS, SECRET_KEY)["origin"] == "imported"
            # tokens are per boot now (an earlier release's were per MAC, for ever): a
            # machine installing across the upgrade needs its next boot's
            token = await booted(where)
            assert token == machine_token(old, MAC, node.state.get(MACHINES_NS, MAC)["nonce"])
            report = node.status()["httpboot"]["journal"]
            assert (report["outcome"], report["records"], report["entries"]) == ("imported", 5, 3)
            machine = json.loads((await fetch(where, "GET", "/api/v1/machines/" + MAC)).body)
            assert [e["seq"] for e in machine["events"]] == [2, 3]
            assert machine["events"][0]["client"] == "10.0.0.5"
            reply = await fetch(where, "POST", EVENTS_URL, headers=bearer(token), body=event_body())
            assert json.loads(reply.body)["seq"] == 4
            cleared = f"/api/v1/machines/{other.replace(':', '-')}/events"
            reply = await fetch(where, "POST", cleared, headers=bearer(await booted(where, other)),
                                body=event_body())  # fmt: skip
            assert json.loads(reply.body)["seq"] == 5  # after the imported clearing
            await wait_until(lambda: node.state.get(EVENTS_NS, f"{MAC}/0000000002") is None,
                             what="the event past retention deleted")  # fmt: skip
        names = sorted(p.name for p in directory.iterdir())
        assert "events.journal" not in names and "secret" in names  # the secret file is kept
        assert [n for n in names if n.startswith("events.journal.imported-")]
        # a journal found once the state holds events: set aside, not imported
        plant_journal(directory / "events.journal", [Event(MAC, 1, 1.0e9, "x", "ok")])
        async with running(tmp_path, settings(retain_events=2)) as (node, listening):
            assert node.status()["httpboot"]["journal"]["outcome"] == "not-imported"
            machine = json.loads(
                (await fetch(address(listening), "GET", "/api/v1/machines/" + MAC)).body
            )
            assert [e["seq"] for e in machine["events"]] == [3, 4]
        assert [p for p in directory.iterdir() if p.name.startswith("events.journal.not-imported-")]


def test_the_example_configuration_shows_the_built_in_default_profile():
    import tomllib

    from appliance.schema import render_example
    from plugins.httpboot.plugin import _DEFAULT_PROFILE, SECTION

    doc = tomllib.loads(render_example([SECTION]))
    assert doc["httpboot"]["profiles"][0] == {"cmdline": "", **_DEFAULT_PROFILE}


async def test_a_kept_script_follows_everything_it_was_made_of(tmp_path):
    """A refetch under the same lease answers the script rendered for that boot, but only
    while its boot, the client, the server address, the profile and the secret are those it
    was made of; a plugin's hook is asked at every fetch all the same."""
    from plugins.httpboot.machines import Standing
    from plugins.httpboot.messages import Request
    from plugins.httpboot.routes import BootPolicy
    from plugins.httpboot.script import Profile

    asked: list[str] = []
    choice: list[str | None] = [None]

    def hook(machine, default):
        asked.append(machine.token)
        return choice[0]

    routes = builtin_routes(tmp_path, script_hook=hook)
    state = routes.machines.state
    leased = Standing("lease", 1.0)
    routes.machines.standing = lambda mac, client: leased

    def fetch_script(client: str = "10.0.0.5", local: tuple[str, int] = ("10.0.0.1", 80)):
        request = Request("GET", "/boot/x.ipxe", b"", {}, (client, 1), local, params={"mac": MAC})
        response = routes.script(request)
        assert not inspect.isawaitable(response)  # answered now: the boot reused
        assert response.status == 200, response
        return response.body.decode()

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            await nursery.start(state.run)
            state.fence.grant(math.inf, 1)
            await Secret(state).ensure(None, "a")
            await routes.machines.new_boot(MAC, "10.0.0.5", leased, "a")
            first = fetch_script()
            assert fetch_script() == first and len(set(asked)) == 1
            # another server address: the kernel's URL follows it, the token does not change
            moved = fetch_script(local=("10.0.0.9", 8080))
            assert "http://10.0.0.9:8080/" in moved and token_of(moved.encode()) == asked[0]
            # a new boot: a new token
            await routes.machines.new_boot(MAC, "10.0.0.5", leased, "a")
            rebooted = fetch_script()
            assert token_of(rebooted.encode()) != token_of(first.encode())
            # a reloaded profile
            profile = Profile("default", "other-kernel", (), "")
            routes.policy = BootPolicy({"default": profile}, {}, "default")
            assert "other-kernel" in fetch_script()
            # a plugin's choice is the answer, the kept default its argument
            choice[0] = "#!ipxe\nexit\n"
            assert fetch_script() == "#!ipxe\nexit\n"
            assert len(asked) == 6
            nursery.cancel_scope.cancel()
