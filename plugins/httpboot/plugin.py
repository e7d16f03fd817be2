"""The ``httpboot`` plugin: the ``[httpboot]`` section, hooks, the ``httpboot.server`` service, status.

Roles: files are served on every node at its own addresses (like TFTP's), at the
rack's VIP only while it holds the lease; so are scripts of a machine's current
boot (the configuration, the rack's token secret and the boot's record in the state
log), while a new boot is recorded by the active node only; events are recorded
only by the active node, in the replicated state log, a standby answers 503 with
``Retry-After`` so the installer tries again and reaches the active one. Every
node shows every committed event. See docs/httpboot.md.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from appliance.api import (
    Bool,
    Field,
    Float,
    Int,
    IPv4Address,
    IPv4Network,
    List,
    Role,
    Section,
    Service,
    Str,
    TableList,
    hookimpl,
)
from appliance.errors import ConfigError, PluginError
from appliance.logs import get_logger
from appliance.schema import Listener
from appliance.state.store import NotWriter

from . import hookspecs
from .connection import Limits
from .identity import parse_mac_untrusted
from .machines import Machines, RefusalMetrics
from .router import RouteConflict, Router
from .routes import BootPolicy, BuiltinRoutes
from .script import Profile
from .server import HttpServer
from .stats import Stats
from .store import SECRET_NS, EventStore, Secret, import_legacy_journal, read_legacy_secret

if TYPE_CHECKING:
    import pluggy

    from appliance.config import Config
    from appliance.node import Node

log = get_logger("httpboot")

_NAME = r"[A-Za-z0-9_.-]{1,64}"
_MAC = r"[0-9a-fA-F]{2}([-:])[0-9a-fA-F]{2}(\1[0-9a-fA-F]{2}){4}"
_NO_SPACE = r"[^\s]*"
_SERVED_ARGS = ("path", "client")  # httpboot_file_served's arguments, in its order

_PROFILE = {
    "name": Field(Str(_NAME, "a profile name (letters, digits, _ . -)"), example="default"),
    "kernel": Field(
        Str(_NO_SPACE, "a file name under root, image:NAME or an http:// URL, without spaces"),
        default="vmlinuz",
        doc="Kernel: a name under root (served at /boot/NAME), image:NAME (the image store's "
        "current version, /images/NAME), an absolute URL, or '' for the local disk.",
    ),
    "initrd": Field(
        List(Str(r"[^\s]+", "a file name under root, image:NAME or an http:// URL")),
        default=(),
        doc="Initrds, in order (names under root, image:NAME, or URLs).",
        example=("initrd.img",),  # as the built-in default profile, so `config example` matches it
    ),
    "cmdline": Field(
        Str(r"[^\r\n]*", "one line of kernel parameters"),
        default="",
        doc="Kernel command line ({mac} and {base} replaced); Rackboot adds rackboot.events and rackboot.token.",
    ),
}

_MACHINE = {
    "mac": Field(Str(_MAC, "a MAC address 'aa:bb:cc:dd:ee:ff'"), example="52:54:00:12:34:56"),
    "profile": Field(Str(_NAME, "a profile name"), example="default"),
}

_DEFAULT_PROFILE = {"name": "default", "kernel": "vmlinuz", "initrd": ["initrd.img"]}

SECTION = Section(
    "httpboot",
    doc="HTTP boot: iPXE scripts per machine, boot files, the installers' events API.",
    fields={
        "enabled": Field(Bool(), default=True, doc="Serve HTTP at all."),
        "addresses": Field(
            List(IPv4Address()),
            default=("0.0.0.0",),
            dev_default=("127.0.0.1",),
            doc="Addresses to listen on ('0.0.0.0': all).",
        ),
        "port": Field(Int(min=0, max=65535), default=80, dev_default=8080, doc="TCP port."),
        "root": Field(
            Str(r"(/.*)?", "an absolute directory path, or '' for <data_dir>/httpboot/root"),
            default="/srv/rackboot/http",
            dev_default="",
            doc="Directory served at /boot/ (created if missing). Symlinks leaving it are refused.",
        ),
        "base_url": Field(
            Str(r"(https?://[^\s/?#]+)?", "'' or a URL such as 'http://192.0.2.1:8080'"),
            default="",
            doc="URL machines reach this server at, for the scripts (default: the address and port each request came to).",
        ),
        "default_profile": Field(
            Str(_NAME, "a profile name"), default="default", doc="Profile of machines not listed."
        ),
        "profiles": Field(
            TableList(_PROFILE), default=[_DEFAULT_PROFILE], doc="Boot profiles (iPXE scripts)."
        ),
        "machines": Field(
            TableList(_MACHINE, max_items=100_000),
            default=(),
            doc="Machine -> profile (DHCP reservations' 'profile' counts too).",
        ),
        "admin_token": Field(
            Str(r"([A-Za-z0-9._~+/-]{32,256})?", "'' or a token of 32-256 URL-safe characters"),
            default="",
            doc="Bearer token for the admin routes; '' disables them (the safe default).",
        ),
        "bind_tokens_to_lease": Field(
            Bool(),
            default=True,
            dev_default=False,
            doc="Serve a machine's script (its events token) and take its events only from the "
            "address of its DHCP lease (bound, unexpired) or reservation. Off: from any address "
            "(the development node, which has no DHCP and listens on loopback only).",
        ),
        "status_networks": Field(
            List(IPv4Network()),
            default=(),
            dev_default=("127.0.0.0/8",),
            doc="Source networks that may read /api/v1/status without the admin token; [] = "
            "the admin token is needed (/metrics stays open).",
        ),
        "secret_file": Field(
            Str(r"(/.*)?", "'' or an absolute file path"),
            default="",
            doc="Deprecated: the rack's token secret lives in the state log. A secret file of an "
            "earlier release (default <data_dir>/httpboot/secret) is imported once by the active "
            "node if the state has none, and ignored afterwards.",
        ),
        "max_connections": Field(
            Int(min=1, max=100_000),
            default=512,
            doc="Open connections; past it a newcomer displaces the oldest waiting connection "
            "of the source holding the most, else 503 and close.",
        ),
        "max_connections_per_source": Field(
            Int(min=1, max=100_000),
            default=32,
            doc="Open connections one client address may hold; past it: 503 and close.",
        ),
        "request_timeout": Field(
            Float(min=0.1, max=3600.0),
            default=10.0,
            doc="Seconds from the accept (or a kept-alive request's first byte) until the head "
            "and body are in; not pushed back by each byte.",
        ),
        "idle_timeout": Field(
            Float(min=0.1, max=3600.0),
            default=60.0,
            doc="Seconds a kept-alive connection may wait for its next request.",
        ),
        "send_timeout": Field(
            Float(min=0.1, max=3600.0),
            default=30.0,
            doc="Seconds a client may take no bytes of a response before it is cut.",
        ),
        "max_event_bytes": Field(
            Int(min=256, max=65536), default=4096, doc="Largest event body accepted (413 past it)."
        ),
        "retain_events": Field(
            Int(min=1, max=100_000), default=256, doc="Events kept per machine (oldest dropped)."
        ),
        "access_log": Field(Bool(), default=True, doc="Log one line per request."),
    },
    listeners=(Listener("tcp", port="port", addresses="addresses", enabled="enabled"),),
)


def _profiles(settings: Any, source: str) -> dict[str, Profile]:
    profiles: dict[str, Profile] = {}
    for i, p in enumerate(settings.profiles):
        if p.name in profiles:
            raise ConfigError(
                source, f"httpboot.profiles[{i}].name", "a profile name not used before", p.name
            )
        profiles[p.name] = Profile(p.name, p.kernel, tuple(p.initrd), p.cmdline)
    if settings.default_profile not in profiles:
        raise ConfigError(
            source, "httpboot.default_profile",
            f"one of the profiles ({', '.join(sorted(profiles)) or 'none defined'})",
            settings.default_profile,
        )  # fmt: skip
    return profiles


def _reserved_addresses(config: Config) -> dict[str, str]:
    """mac -> address of the DHCP reservations made by MAC: the address that speaks for it."""
    dhcp = config.sections.get("dhcp")
    return {
        parse_mac_untrusted(r.mac) or r.mac: str(r.address)
        for r in (dhcp.reservations if dhcp is not None else ())
        if r.mac is not None
    }


def _machines(config: Config, profiles: dict[str, Profile]) -> dict[str, str]:
    """mac -> profile: DHCP reservations' ``profile``, then ``[[httpboot.machines]]``."""
    known = ", ".join(sorted(profiles))
    machines: dict[str, str] = {}
    dhcp = config.sections.get("dhcp")
    for i, r in enumerate(dhcp.reservations if dhcp is not None else ()):
        if r.profile is None or r.mac is None:
            continue
        if r.profile not in profiles:
            raise ConfigError(
                config.source, f"dhcp.reservations[{i}].profile", f"one of [httpboot] profiles ({known})", r.profile
            )  # fmt: skip
        machines[parse_mac_untrusted(r.mac) or r.mac] = r.profile
    seen: set[str] = set()
    for i, m in enumerate(config["httpboot"].machines):
        mac = parse_mac_untrusted(m.mac) or m.mac
        if mac in seen:
            raise ConfigError(config.source, f"httpboot.machines[{i}].mac", "a MAC not listed before", m.mac)  # fmt: skip
        if m.profile not in profiles:
            raise ConfigError(
                config.source, f"httpboot.machines[{i}].profile", f"one of the profiles ({known})", m.profile
            )  # fmt: skip
        seen.add(mac)
        machines[mac] = m.profile
    return machines


class HttpBootPlugin:
    def __init__(self) -> None:
        self.pm: pluggy.PluginManager | None = None
        self.settings: Any = None
        self.policy: BootPolicy | None = None
        self.reserved: dict[str, str] = {}
        self.active = False
        self.service: _Service | None = None

    @hookimpl
    def rackboot_addhooks(self, pluginmanager: pluggy.PluginManager) -> None:
        pluginmanager.add_hookspecs(hookspecs)
        self.pm = pluginmanager

    @hookimpl
    def rackboot_config_schema(self) -> Section:
        return SECTION

    @hookimpl
    def rackboot_configure(self, config: Config) -> None:
        self.settings = settings = config["httpboot"]
        profiles = _profiles(settings, config.source)
        self.policy = BootPolicy(profiles, _machines(config, profiles), settings.default_profile)
        self.reserved = _reserved_addresses(config)

    @hookimpl
    def rackboot_services(self, node: Node) -> list[Service]:
        if not self.settings.enabled:
            log.info("httpboot not serving", reason="disabled")
            return []
        self.service = _Service(self, node)
        return [Service("server", self.service.run)]

    @hookimpl
    def rackboot_role_changed(self, node: Node, old: Role, new: Role) -> None:
        self.active = new is Role.ACTIVE
        if self.service is not None:
            self.service.role_changed()

    @hookimpl
    def rackboot_status(self, node: Node) -> dict[str, Any]:
        service = self.service
        if service is None:
            return {"serving": False}
        return {
            "serving": True,
            "listening": [f"{a}:{p}" for a, p in service.server.bound],
            "root": str(service.root),
            "recording_events": self.active,
            "secret": "present" if service.secret() is not None else "absent",
            "machines_with_events": len(service.store.table),
            "machines": service.machines.status(),
            "events": service.store.status(),
            "journal": service.legacy_journal,
            **service.stats.as_dict(),
        }


def file_served_caller(hook: Any) -> Callable[[str, str], object] | None:
    """``httpboot_file_served`` as a plain function, or None if no plugin implements it.
    Without wrappers the implementations are called directly, as pluggy calls them (the
    last registered first, each with the arguments it names, an exception stopping the
    rest): pluggy's own call cost ~2 µs on every file served."""
    impls = hook.get_hookimpls()
    if not impls:
        return None
    if any(impl.hookwrapper or impl.wrapper for impl in impls):  # pluggy's to run
        return lambda path, client: hook(path=path, client=client)
    calls = [(impl.function, impl.argnames) for impl in reversed(impls)]

    def served(path: str, client: str) -> None:
        for function, names in calls:
            if names == _SERVED_ARGS:
                function(path, client)
            else:
                given = {"path": path, "client": client}
                function(*[given[name] for name in names])

    return served


class _Service:
    """One node's HTTP service: server, event store, counters."""

    def __init__(self, plugin: HttpBootPlugin, node: Node) -> None:
        settings = plugin.settings
        self.plugin, self.node = plugin, node
        self.root = Path(settings.root) if settings.root else node.data_dir / "httpboot" / "root"
        self.stats = Stats()
        node.metrics.register(self.stats)
        self.store = EventStore(node.state, settings.retain_events)
        self.secret = Secret(node.state)
        assert plugin.policy is not None
        self.machines = Machines(
            node.state,
            reservations=plugin.reserved,
            listed=plugin.policy.machines.keys(),
            bind=settings.bind_tokens_to_lease,
        )
        node.metrics.register(RefusalMetrics(self.machines))
        # The files of earlier releases, imported once by an active node (docs/httpboot.md).
        self.legacy_secret_path = (
            Path(settings.secret_file)
            if settings.secret_file
            else node.plugin_dir("httpboot") / "secret"
        )
        self.legacy_journal_path = node.plugin_dir("httpboot") / "events.journal"
        # Its import: "none" (no such file), "pending" (until this node is active), then
        # "imported", "not-imported" (the state had events already) or "failed".
        self.legacy_journal: dict[str, Any] = {"outcome": "none", "damage": []}
        self.settled = False  # the duties of an active node done (secret, import), once
        self._role_changed = trio.Event()
        self.server = HttpServer(
            addresses=tuple(ipaddress.IPv4Address(str(a)) for a in settings.addresses),
            port=settings.port,
            router=Router([]),  # the real one once the secret is read (run)
            limits=Limits(settings.request_timeout, settings.idle_timeout, settings.send_timeout),
            stats=self.stats,
            max_connections=settings.max_connections,
            max_per_source=settings.max_connections_per_source,
            access_log=settings.access_log,
            fence=node.fence,
        )

    def role_changed(self) -> None:
        changed, self._role_changed = self._role_changed, trio.Event()
        changed.set()

    def _router(self) -> Router:
        plugin, node, settings = self.plugin, self.node, self.plugin.settings
        assert plugin.pm is not None and plugin.policy is not None
        hook = plugin.pm.hook
        builtin = BuiltinRoutes(
            root=self.root,
            policy=plugin.policy,
            secret=self.secret,
            store=self.store,
            stats=self.stats,
            public_url=settings.base_url,
            admin_token=settings.admin_token,
            max_event_bytes=settings.max_event_bytes,
            is_active=lambda: plugin.active,
            status=node.status,
            metrics=node.metrics,
            # No plugin chooses scripts: no hook call per script (asked once, at the start).
            script_hook=hook.httpboot_boot_script
            if hook.httpboot_boot_script.get_hookimpls()
            else _no_choice,
            event_hook=hook.httpboot_machine_event,
            machines=self.machines,
            # (a default is not run through its kind: it may still be text)
            status_networks=tuple(ipaddress.IPv4Network(str(n)) for n in settings.status_networks),
            node_name=node.config.node.name,
        )
        added = [route for routes in hook.httpboot_routes(node=node) for route in routes or ()]
        try:
            return Router(builtin.api() + added + builtin.files())
        except (RouteConflict, ValueError) as exc:
            raise PluginError(f"httpboot_routes: {exc}") from None

    def _file_served_hook(self) -> Callable[[str, str], object] | None:
        """The httpboot_file_served hook, or None if no plugin implements it (asked once:
        the connection then skips it at no cost)."""
        assert self.plugin.pm is not None
        return file_served_caller(self.plugin.pm.hook.httpboot_file_served)

    async def run(self, node: Node, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self.plugin.settings.secret_file:
            log.warning("httpboot.secret_file is deprecated: the rack's token secret lives in "
                        "the state log; the file is only imported once, if the state has none",
                        path=str(self.legacy_secret_path))  # fmt: skip
        # Read (and its mode checked) at every start: a readable secret stops the service.
        legacy_secret = await trio.to_thread.run_sync(read_legacy_secret, self.legacy_secret_path)
        if not self.root.is_dir():
            self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
            log.info("created HTTP root", root=str(self.root))
        self.server.router = self._router()
        self.server.file_served = self._file_served_hook()
        if self.legacy_journal_path.exists():
            self.legacy_journal = {"outcome": "pending", "damage": []}
        self.store.load()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.store.follow)
            nursery.start_soon(self.store.announce_late)
            nursery.start_soon(self._watch_secret, legacy_secret)
            nursery.start_soon(self._duties, legacy_secret)
            await nursery.start(self.server.serve)
            log.info(
                "listening",
                addresses=[f"{a}:{p}" for a, p in self.server.bound],
                root=str(self.root),
            )
            task_status.started()

    async def _duties(self, legacy_secret: bytes | None) -> None:
        """What the active node writes once: the token secret if the state has none, the
        events journal of an earlier release. Again at each becoming active until done."""
        while not self.settled:
            changed = self._role_changed
            if self.plugin.active and self.node.fence.ok():
                try:
                    await self.secret.ensure(legacy_secret, self.node.config.node.name)
                    await self._import_journal()
                    self.settled = True
                    return
                except NotWriter as exc:
                    log.warning("lost the lease before the events secret or journal were "
                                "written; again when active", error=str(exc))  # fmt: skip
            await changed.wait()

    async def _import_journal(self) -> None:
        try:
            self.legacy_journal = await import_legacy_journal(
                self.node.state, self.legacy_journal_path,
                self.plugin.settings.retain_events, self.node.config.node.name,
            )  # fmt: skip
        except OSError as exc:  # a migration that fails does not stop the node: it says so
            log.error("could not import the events journal of an earlier release",
                      file=str(self.legacy_journal_path), error=str(exc))  # fmt: skip
            self.legacy_journal = {"outcome": "failed", "error": str(exc), "damage": []}

    async def _watch_secret(self, legacy_secret: bytes | None) -> None:
        """Say when the rack's secret is here (a standby's scripts answer 503 until then),
        and whether a secret file of an earlier release differs from it (the tokens that
        file made are refused from now on)."""
        state = self.node.state
        had: bytes | None = None
        async with aclosing(state.subscribe(SECRET_NS, state.position)) as changes:
            while True:
                secret = self.secret()
                if secret is not None and secret != had:
                    log.info("the rack's events token secret is here", lsn=state.position.lsn)
                    if legacy_secret is not None and legacy_secret != secret:
                        log.warning("the secret file of an earlier release differs from the "
                                    "rack's token secret and is ignored: tokens made with it "
                                    "are refused; remove it",
                                    path=str(self.legacy_secret_path))  # fmt: skip
                had = secret
                await anext(changes)


def _no_choice(**_: object) -> None:
    """The httpboot_boot_script hook when no plugin implements it: the default script."""
    return None


plugin = HttpBootPlugin()
