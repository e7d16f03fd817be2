"""The built-in routes: boot scripts and files, the machines' events API, status, metrics.

==========================================  ===========================================
``GET /boot/{mac}.ipxe``                     the machine's iPXE script (its address only)
``GET /boot/{path}``                         a file under the root, confined
``POST /api/v1/machines/{mac}/events``       an installer's event (its address, boot's token)
``GET /api/v1/machines/{mac}``               a machine's events and last stage
``GET /api/v1/machines``                     machines with events, a page (limit, after)
``DELETE /api/v1/machines/{mac}/events``     forget a machine's events (admin token)
``GET /api/v1/status``                       the node's status (admin token or network)
``GET /metrics``                             the node's Prometheus registry
==========================================  ===========================================
"""

from __future__ import annotations

import errno
import ipaddress
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import prometheus_client

from appliance import confine
from appliance.logs import get_logger
from appliance.state.store import NotWriter

from .beneath import BeneathRoot
from .events import BadEvent, Event, parse_event_untrusted
from .files import content_type
from .hot import HotFiles
from .identity import bearer_untrusted, machine_token, parse_mac_untrusted, token_matches
from .machines import Boot, Machines, Standing
from .messages import Request, Response, Route
from .script import Machine, Profile, base_url, render_ipxe
from .stats import Stats
from .store import EventStore
from .urlpath import BadTarget, parse_query_untrusted

log = get_logger("httpboot")

CHALLENGE = (b"www-authenticate", b'Bearer realm="rackboot"')
_NOT_ITS_ADDRESS = "only the address of this machine's DHCP lease or reservation may ask"
PAGE_DEFAULT, PAGE_MAX = 100, 1000  # machines per page of GET /api/v1/machines
RENDERED_MAX = 4096  # machines whose current script is kept rendered


@dataclass(frozen=True)
class RenderedScript:
    """A machine's default script, rendered once per boot (HMAC and text ~10 µs of each
    script): ``made`` what it was made of, ``heads`` its answer's head per second."""

    made: tuple
    machine: Machine
    default: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    heads: dict[bytes, bytes]


@dataclass(frozen=True)
class BootPolicy:
    """Which profile a machine boots: the configured mapping, else the default."""

    profiles: Mapping[str, Profile]
    machines: Mapping[str, str]  # mac -> profile name
    default: str

    def profile_for(self, mac: str) -> Profile:
        return self.profiles[self.machines.get(mac, self.default)]


class BuiltinRoutes:
    def __init__(
        self,
        *,
        root: Path,
        policy: BootPolicy,
        secret: Callable[[], bytes | None],
        store: EventStore,
        stats: Stats,
        public_url: str,
        admin_token: str,
        max_event_bytes: int,
        is_active: Callable[[], bool],
        status: Callable[[], dict[str, Any]],
        metrics: prometheus_client.CollectorRegistry,
        script_hook: Callable[..., str | None],
        event_hook: Callable[..., object],
        machines: Machines,
        status_networks: tuple[ipaddress.IPv4Network, ...] = (),
        node_name: str = "",
    ) -> None:
        self.root = root
        self.beneath = BeneathRoot(root)  # the fast path of confine.open_confined
        self.hot = HotFiles(self.beneath, content_type, time.monotonic, time.time)
        self.policy = policy
        self.secret = secret  # the rack's token secret, None until this node has it
        self.store = store
        self.stats = stats
        self.public_url = public_url.rstrip("/")
        self.admin_token = admin_token
        self.max_event_bytes = max_event_bytes
        self.is_active = is_active
        self.status_of_node = status
        self.metrics = metrics
        self.script_hook = script_hook
        self._rendered: dict[str, RenderedScript] = {}  # mac -> its current boot's script
        self.event_hook = event_hook
        self.machines = machines  # boots, and which address speaks for a MAC
        self.status_networks = status_networks
        self.node_name = node_name

    def api(self) -> list[Route]:
        """Routes matched before any plugin's."""
        events = "/api/v1/machines/{mac}/events"
        return [
            Route("GET", "/boot/{mac}.ipxe", self.script, name="script"),
            Route("POST", events, self.post_event, self.max_event_bytes, name="events"),
            Route("DELETE", events, self.clear_events, name="clear-events"),
            Route("GET", "/api/v1/machines/{mac}", self.machine, name="machine"),
            Route("GET", "/api/v1/machines", self.machines_page, name="machines"),
            Route("GET", "/api/v1/status", self.status, name="status"),
            Route("GET", "/metrics", self.prometheus, name="metrics"),
        ]

    def files(self) -> list[Route]:
        """Routes matched after every plugin's."""
        return [Route("GET", "/boot/{path:path}", self.static, name="static")]

    # -- boot -------------------------------------------------------------

    def static(self, request: Request) -> Response:
        name = request.params["path"]
        hot = self.hot.get(name)  # a small file kept, still the same (hot.py)
        if hot is not None:
            return Response.kept(hot.content, hot.stat, hot.headers, hot.heads)
        opened = self.beneath.open(name)  # a regular file under the root
        if opened is not None:
            hot = self.hot.keep(name, *opened)
            if hot is None:
                return Response.file(*opened)
            opened[0].close()
            return Response.kept(hot.content, hot.stat, hot.headers, hot.heads)
        try:  # anything else: the one answer of the full resolution (404, 403 or the file)
            handle, st = confine.open_confined(self.root, request.params["path"])
        except (confine.NotFound, FileNotFoundError, NotADirectoryError):
            return Response.error(404)
        except confine.Refused:
            return Response.error(403)
        except OSError as exc:
            # The root changing under the resolution (a symlink swapped between two of its
            # system calls: ELOOP, EINVAL from readlink, ...) or a failing disk: whatever
            # it was, this name cannot be served now, and the request is not the server's
            # fault (never a 500). The errno only, never the path, in the log.
            log.info(
                "file refused: resolving it failed", errno=errno.errorcode.get(exc.errno or 0, "?")
            )
            return Response.error(403)
        return Response.file(handle, st)

    def script(self, request: Request) -> Response | Awaitable[Response]:
        """The machine's script, answered at once when nothing needs to wait (a refusal, or
        the machine's current boot reused: a refetch under the lease it was served under);
        a new boot is the awaitable :meth:`_new_boot_script`, answered once its record
        committed. The server answers a plain result in the lane (fastpath.py) and hands an
        awaitable to the connection's task."""
        mac = parse_mac_untrusted(request.params["mac"])
        if mac is None:  # not a machine's script: a file of that name, if any
            request.params["path"] = request.path.removeprefix("/boot/")
            return self.static(request)
        secret = self.secret()
        if secret is None:  # a standby before the active's secret reached it: no token to give
            self.stats.scripts_unavailable += 1
            return Response.unavailable("no events token secret here yet; try again")
        client = request.client[0]
        standing = self.machines.standing(mac, client)
        if standing is None:  # the script holds the machine's token: for the machine only
            return self._not_its_address("script", mac)
        boot = self.machines.reusable(mac, client, standing)
        if boot is not None:  # the same boot, the same token: nothing to write or wait for
            return self._script(request, mac, secret, boot)
        if not self.is_active():
            self.machines.refused("script", "standby")
            return Response.unavailable("a new boot is recorded by the active node")
        return self._new_boot_script(request, mac, secret, standing)

    async def _new_boot_script(
        self, request: Request, mac: str, secret: bytes, standing: Standing
    ) -> Response:
        """A new boot: a new token, committed before anyone holds it."""
        try:
            boot = await self.machines.new_boot(mac, request.client[0], standing, self.node_name)
        except NotWriter:
            boot = None
        if boot is None:  # the lease lost, or no commit in time: this token is no one's
            self.machines.refused("script", "not-recorded")
            return _standby()
        return self._script(request, mac, secret, boot)

    def _script(self, request: Request, mac: str, secret: bytes, boot: Boot) -> Response:
        client, profile = request.client[0], self.policy.profile_for(mac)
        made = (boot.nonce, client, request.local, profile, secret)
        kept = self._rendered.get(mac)
        if kept is None or kept.made != made:
            kept = self._render(mac, made)
        try:
            chosen = self.script_hook(machine=kept.machine, default=kept.default)
        except Exception as exc:
            log.error("boot script hook failed", mac=mac, error=f"{type(exc).__name__}: {exc}")
            return Response.error(500)
        self.stats.scripts[profile.name] += 1
        if chosen is not None:
            return Response.text(chosen)
        return Response(200, kept.headers, kept.body, heads=kept.heads)

    def _render(self, mac: str, made: tuple) -> RenderedScript:
        """The machine's default script for this boot, client, server address, profile and
        secret (``made``), kept: a refetch under the same lease answers the same bytes."""
        nonce, client, local, profile, secret = made
        machine = Machine(
            mac=mac,
            profile=profile,
            base_url=self.public_url or base_url(*local),
            token=machine_token(secret, mac, nonce),
            client=client,
        )
        default = render_ipxe(machine)
        plain = Response.text(default)
        kept = RenderedScript(made, machine, default, plain.headers, plain.body, {})
        if len(self._rendered) >= RENDERED_MAX:  # one per machine that booted: bounded anyway
            self._rendered.clear()
        self._rendered[mac] = kept
        return kept

    # -- events -----------------------------------------------------------

    def _machine_or_none(self, request: Request) -> str | None:
        return parse_mac_untrusted(request.params["mac"])

    def _not_its_address(self, route: str, mac: str) -> Response:
        """403 to an address that does not speak for a machine Rackboot knows, 404 for a
        machine it does not know (no boot, no reservation, not configured)."""
        if self.machines.known(mac):
            reason, status, detail = "wrong-source", 403, _NOT_ITS_ADDRESS
        else:
            reason, status, detail = "unknown-machine", 404, "no such machine here"
        if route == "events":
            self.stats.event_refusals[reason] += 1
        else:
            self.machines.refused(route, reason)
        return Response.error(status, detail)

    async def post_event(self, request: Request) -> Response:
        mac = self._machine_or_none(request)
        if mac is None:
            return Response.error(404)
        secret = self.secret()
        if secret is None:
            self.stats.event_refusals["no-secret"] += 1
            return Response.unavailable("no events token secret here yet; try again")
        boot = self.machines.boot(mac)
        if boot is None:  # never given a token: no event of it can be genuine
            self.stats.event_refusals["unknown-machine"] += 1
            return Response.error(404, "no boot of this machine here: its script gives the token")
        if self.machines.standing(mac, request.client[0]) is None:
            return self._not_its_address("events", mac)
        presented = bearer_untrusted(request.header(b"authorization"))
        if not token_matches(machine_token(secret, mac, boot.nonce), presented):
            self.stats.event_refusals["unauthorized"] += 1
            return _unauthorized()
        if not self.is_active():
            self.stats.event_refusals["standby"] += 1
            return _standby()
        try:
            stage, status, message = parse_event_untrusted(request.body, self.max_event_bytes)
        except BadEvent as exc:
            self.stats.event_refusals["invalid"] += 1
            return Response.error(400, str(exc))
        event = self.store.next_event(mac, stage, status, message, time.time(), request.client[0])
        # Appended only by the holder of the lease (the state store asks the fence), and
        # answered once committed: durable here and acknowledged by the standbys. A lease
        # lost before the commit: neither acknowledged nor announced; the installer
        # retries at the new active, which never saw this record.
        refusal = await self.store.record(event, self._announce)
        if refusal is not None:
            self.stats.event_refusals[refusal] += 1
            return _standby()
        self.stats.events_recorded[status] += 1
        return Response.json({"mac": mac, **event.as_json()}, status=201)

    def _announce(self, event: Event) -> None:
        """Once per committed event, on the node that recorded it."""
        log.info("machine event", mac=event.mac, seq=event.seq, stage=event.stage,
                 status=event.status)  # fmt: skip
        try:
            self.event_hook(event=event)
        except Exception as exc:
            log.error("machine event hook failed", mac=event.mac,
                      error=f"{type(exc).__name__}: {exc}")  # fmt: skip

    async def clear_events(self, request: Request) -> Response:
        if not self.admin_token:
            return Response.error(403, "admin API disabled (httpboot.admin_token is not set)")
        if not token_matches(self.admin_token, bearer_untrusted(request.header(b"authorization"))):
            return _unauthorized()
        mac = self._machine_or_none(request)
        if mac is None:
            return Response.error(404)
        if not self.is_active():
            return _standby()
        forgotten, refusal = await self.store.clear(mac)
        if refusal is not None:
            return _standby()
        log.info("machine events cleared", mac=mac, events=forgotten, client=request.client[0])
        return Response.json({"mac": mac, "cleared": forgotten})

    def machine(self, request: Request) -> Response:
        mac = self._machine_or_none(request)
        if mac is None:
            return Response.error(404)
        events = self.store.table.events(mac)
        last = events[-1] if events else None
        return Response.json(
            {
                "mac": mac,
                "profile": self.policy.profile_for(mac).name,
                "stage": last.stage if last else None,
                "status": last.status if last else None,
                "events": [event.as_json() for event in events],
            }
        )

    def machines_page(self, request: Request) -> Response:
        """Machines with events in MAC order, ``limit`` (default PAGE_DEFAULT, at most
        PAGE_MAX) after the MAC ``after``; ``next`` is the ``after`` of the next page."""
        try:
            query = parse_query_untrusted(request.query, ("limit", "after"))
        except BadTarget as exc:
            return Response.error(400, str(exc))
        limit_text = query.get("limit", str(PAGE_DEFAULT))
        limit = int(limit_text) if limit_text.isdigit() and len(limit_text) <= 6 else 0
        if not 1 <= limit <= PAGE_MAX:
            return Response.error(400, f"limit: expected 1 to {PAGE_MAX}")
        after = parse_mac_untrusted(query["after"]) if "after" in query else None
        if "after" in query and after is None:
            return Response.error(400, "after: expected a MAC (the 'next' of a page)")
        table = self.store.table
        macs = table.page(after, limit + 1)
        more = len(macs) > limit
        rows = []
        for mac in macs[:limit]:
            last = table.last(mac)
            rows.append(
                {
                    "mac": mac,
                    "stage": last.stage if last else None,
                    "status": last.status if last else None,
                    "time": last.time if last else None,
                    "events": len(table.events(mac)),
                }
            )
        return Response.json(
            {"machines": rows, "limit": limit, "next": rows[-1]["mac"] if more else None}
        )

    # -- the node ---------------------------------------------------------

    def status(self, request: Request) -> Response:
        """The node's paths, pid and listeners are for its operators: the admin token, or
        a source in ``status_networks``. (``/metrics`` stays open for scrapers.)"""
        if not self._in_status_networks(request.client[0]):
            presented = bearer_untrusted(request.header(b"authorization"))
            if not self.admin_token:
                self.machines.refused("status", "forbidden")
                return Response.error(403, "status needs httpboot.admin_token or status_networks")
            if not token_matches(self.admin_token, presented):
                self.machines.refused("status", "unauthorized")
                return _unauthorized("status needs the admin token")
        return Response.json(self.status_of_node())

    def _in_status_networks(self, client: str) -> bool:
        try:
            address = ipaddress.IPv4Address(client)
        except ValueError:
            return False
        return any(address in network for network in self.status_networks)

    def prometheus(self, request: Request) -> Response:
        text = prometheus_client.generate_latest(self.metrics)
        content_type = prometheus_client.CONTENT_TYPE_LATEST.encode()
        return Response(
            200, [(b"content-type", content_type), (b"cache-control", b"no-store")], text
        )


def _unauthorized(detail: str = "") -> Response:
    refused = Response.error(401, detail)
    refused.headers.append(CHALLENGE)
    return refused


def _standby() -> Response:
    return Response.unavailable("not recording here now; try again")
