"""The built-in routes: boot scripts and files, the machines' events API, status, metrics.

==========================================  ===========================================
``GET /boot/{mac}.ipxe``                     the machine's iPXE script (its profile)
``GET /boot/{path}``                         a file under the root, confined
``POST /api/v1/machines/{mac}/events``       an installer's event (machine token)
``GET /api/v1/machines/{mac}``               a machine's events and last stage
``GET /api/v1/machines``                     every machine with events, last stage
``DELETE /api/v1/machines/{mac}/events``     forget a machine's events (admin token)
``GET /api/v1/status``                       the node's status (``rackboot status``)
``GET /metrics``                             the node's Prometheus registry
==========================================  ===========================================
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import prometheus_client

from appliance import confine
from appliance.logs import get_logger

from .events import BadEvent, Event, parse_event_untrusted
from .identity import bearer_untrusted, machine_token, parse_mac_untrusted, token_matches
from .messages import Request, Response, Route
from .script import Machine, Profile, base_url, render_ipxe
from .stats import Stats
from .store import EventStore

log = get_logger("httpboot")

CHALLENGE = (b"www-authenticate", b'Bearer realm="rackboot"')


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
    ) -> None:
        self.root = root
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
        self.event_hook = event_hook

    def api(self) -> list[Route]:
        """Routes matched before any plugin's."""
        events = "/api/v1/machines/{mac}/events"
        return [
            Route("GET", "/boot/{mac}.ipxe", self.script, name="script"),
            Route("POST", events, self.post_event, self.max_event_bytes, name="events"),
            Route("DELETE", events, self.clear_events, name="clear-events"),
            Route("GET", "/api/v1/machines/{mac}", self.machine, name="machine"),
            Route("GET", "/api/v1/machines", self.machines, name="machines"),
            Route("GET", "/api/v1/status", self.status, name="status"),
            Route("GET", "/metrics", self.prometheus, name="metrics"),
        ]

    def files(self) -> list[Route]:
        """Routes matched after every plugin's."""
        return [Route("GET", "/boot/{path:path}", self.static, name="static")]

    # -- boot -------------------------------------------------------------

    def static(self, request: Request) -> Response:
        try:
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

    def script(self, request: Request) -> Response:
        mac = parse_mac_untrusted(request.params["mac"])
        if mac is None:  # not a machine's script: a file of that name, if any
            request.params["path"] = request.path.removeprefix("/boot/")
            return self.static(request)
        secret = self.secret()
        if secret is None:  # a standby before the active's secret reached it: no token to give
            self.stats.scripts_unavailable += 1
            return Response.unavailable("no events token secret here yet; try again")
        machine = Machine(
            mac=mac,
            profile=self.policy.profile_for(mac),
            base_url=self.public_url or base_url(*request.local),
            token=machine_token(secret, mac),
            client=request.client[0],
        )
        default = render_ipxe(machine)
        try:
            chosen = self.script_hook(machine=machine, default=default)
        except Exception as exc:
            log.error("boot script hook failed", mac=mac, error=f"{type(exc).__name__}: {exc}")
            return Response.error(500)
        self.stats.scripts[machine.profile.name] += 1
        return Response.text(default if chosen is None else chosen)

    # -- events -----------------------------------------------------------

    def _machine_or_none(self, request: Request) -> str | None:
        return parse_mac_untrusted(request.params["mac"])

    async def post_event(self, request: Request) -> Response:
        mac = self._machine_or_none(request)
        if mac is None:
            return Response.error(404)
        secret = self.secret()
        if secret is None:
            self.stats.event_refusals["no-secret"] += 1
            return Response.unavailable("no events token secret here yet; try again")
        presented = bearer_untrusted(request.header(b"authorization"))
        if not token_matches(machine_token(secret, mac), presented):
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

    def machines(self, request: Request) -> Response:
        table = self.store.table
        rows = []
        for mac in table:
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
        return Response.json({"machines": rows})

    # -- the node ---------------------------------------------------------

    def status(self, request: Request) -> Response:
        return Response.json(self.status_of_node())

    def prometheus(self, request: Request) -> Response:
        text = prometheus_client.generate_latest(self.metrics)
        content_type = prometheus_client.CONTENT_TYPE_LATEST.encode()
        return Response(
            200, [(b"content-type", content_type), (b"cache-control", b"no-store")], text
        )


def _unauthorized() -> Response:
    refused = Response.error(401)
    refused.headers.append(CHALLENGE)
    return refused


def _standby() -> Response:
    return Response.unavailable("not recording here now; try again")
