"""The ``dhcp`` plugin: its configuration, hooks, service, status, control and CLI commands."""

from __future__ import annotations

import dataclasses
from ipaddress import IPv4Address
from typing import TYPE_CHECKING, Any

from appliance.api import Role, Service, hookimpl
from appliance.config import Config
from appliance.logs import get_logger

from . import hookspecs
from .boot import BootChoice, BootRequest
from .codec import Message
from .commands import cli_commands
from .leases import Lease, LeaseState, LeaseView, address_text
from .metrics import DhcpMetrics
from .model import Reservation, ServerConfig
from .schema import SECTION, server_config
from .server import DhcpServer, Policy
from .service import DhcpService
from .store import LeaseStore

if TYPE_CHECKING:
    import pluggy

    from appliance.node import Node

log = get_logger("dhcp")


class DhcpPlugin:
    def __init__(self) -> None:
        self.pm: pluggy.PluginManager | None = None
        self.settings: Any = None
        self.server_config: ServerConfig | None = None
        self.service: DhcpService | None = None

    @hookimpl
    def rackboot_addhooks(self, pluginmanager: pluggy.PluginManager) -> None:
        pluginmanager.add_hookspecs(hookspecs)
        self.pm = pluginmanager

    @hookimpl
    def rackboot_config_schema(self):
        return SECTION

    @hookimpl
    def rackboot_configure(self, config: Config) -> None:
        self.settings = config["dhcp"]
        self.server_config = server_config(self.settings, config.source)

    @hookimpl
    def rackboot_services(self, node: Node) -> list[Service]:
        settings = self.settings
        if not settings.enabled or not settings.interfaces:
            log.info(
                "dhcp not serving",
                reason="disabled" if not settings.enabled else "no interfaces configured",
            )
            return []
        ha = getattr(node, "ha", None)
        rack = ha is not None and ha.elects  # an appliance of a rack: others write the log
        config = self.server_config
        assert config is not None
        vip = IPv4Address(node.fence.vip) if rack and node.fence.vip else None
        if vip is not None:
            if config.server_address is not None and config.server_address != vip:
                log.warning("dhcp.server_address is not the rack's VIP: the VIP is the server "
                            "identifier", server_address=str(config.server_address),
                            vip=str(vip))  # fmt: skip
            config = dataclasses.replace(config, vip=vip)
        assert self.pm is not None
        server = DhcpServer(config, LeaseView(), policy=_HookPolicy(self.pm))
        # Dynamic answers only once the node is active: a standalone node becomes active
        # when every service is ready, an HA node when it holds the rack's lease.
        server.active = node.role is Role.ACTIVE
        store = LeaseStore(node.state, server.leases,
                           legacy=node.plugin_dir("dhcp") / "leases.journal")  # fmt: skip
        own = (int(config.server_address),) if config.server_address is not None else ()
        self.service = DhcpService(
            server,
            store,
            tuple(settings.interfaces),
            DhcpMetrics(node.metrics, server),
            events=self._lease_event,
            probe_timeout=settings.probe_timeout,
            fence=node.fence.ok,
            replicated=rack,
            name=node.config.node.name,
            own_addresses=own,
            rack_addresses=_peer_addresses(node.config["ha"].peers) if rack else (),
            log_exchanges=node.config.node.log_exchanges,
        )
        return [Service("server", self.service.run)]

    @hookimpl
    def rackboot_role_changed(self, node: Node, old: Role, new: Role) -> None:
        if self.service is not None:
            self.service.set_active(new is Role.ACTIVE)

    @hookimpl(optionalhook=True)
    def relay_local_server(self) -> DhcpService | None:
        """The relay plugin's hook (plugins/relay/hookspecs.py): this process's server."""
        return self.service

    @hookimpl
    def rackboot_status(self, node: Node) -> dict[str, Any]:
        if self.service is None:
            return {"serving": False}
        server = self.service.server
        pools = server.pool_usage(self.service.clock())
        store = self.service.store
        # "journal": the journal of an earlier release, while one was found at this start
        journal = {"journal": store.legacy_report} if store.legacy_report else {}
        return {
            "serving": True,
            "answering_pools": server.active,
            "interfaces": list(self.service.interfaces),
            "port": server.config.server_port,
            "pools": {key: {"active": used, "size": size} for key, (used, size) in pools.items()},
            "messages": dict(self.service.metrics.totals),
            "store": store.status(),
            "vip": str(server.config.vip) if server.config.vip is not None else None,
            # the rack's appliances' identifiers (announced) and this node's: what a
            # client may see as option 54 from this rack (`rackboot doctor --dhcp-probe`)
            "server_identifiers": sorted(
                map(address_text, server.aliases | set(self.service.own_addresses)),
                key=lambda text: IPv4Address(text),
            ),
            **journal,
        }

    @hookimpl
    def rackboot_control_commands(self, node: Node):
        return {"dhcp.leases": self._leases}

    @hookimpl
    def rackboot_doctor_checks(self, options) -> list:
        from .doctor import checks  # the doctor's process only

        return checks(options)

    @hookimpl
    def rackboot_cli_commands(self):
        return cli_commands()

    def _leases(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        if self.service is None:
            return []
        now = self.service.clock()
        return [
            lease_json(lease, now)
            for lease in sorted(self.service.server.leases, key=lambda lease: lease.address)
            if args.get("all") or lease.active(now)
        ]

    def _lease_event(self, lease: Lease) -> None:
        assert self.pm is not None
        hook = self.pm.hook
        caller = (
            hook.dhcp_lease_committed
            if lease.state is LeaseState.BOUND
            else (hook.dhcp_lease_released)
        )
        if caller.get_hookimpls():  # once per ACK: no call at all when nobody listens
            caller(lease=lease)


def _peer_addresses(peers: Any) -> tuple[int, ...]:
    """The other appliances' addresses as ``[ha] peers`` names them (``ID@host:port``):
    on a flat network, also the server identifiers their older configurations used."""
    out = []
    for member in peers:
        host = str(member).partition("@")[2].rpartition(":")[0]
        try:
            out.append(int(IPv4Address(host)))
        except ValueError:
            continue
    return tuple(out)


class _HookPolicy(Policy):
    """The server's extension points, answered by the plugins' hooks."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.hook = pm.hook

    def host(self, mac: str, client_id: bytes | None) -> Reservation | None:
        return _guarded(self.hook.dhcp_host_lookup, None, mac=mac, client_id=client_id)

    def looks_up_hosts(self) -> bool:
        return bool(self.hook.dhcp_host_lookup.get_hookimpls())

    def boot(self, request: BootRequest, default: BootChoice | None) -> BootChoice | None:
        chosen = _guarded(self.hook.dhcp_boot_selection, None, request=request, default=default)
        return default if chosen is None else chosen

    def boots_any_client(self) -> bool:
        return bool(self.hook.dhcp_boot_selection.get_hookimpls())

    def reply_options(self, request: Message, reply: Message, lease: Lease | None) -> None:
        _guarded(self.hook.dhcp_reply_options, None, request=request, reply=reply, lease=lease)

    def alters_replies(self) -> bool:
        return bool(self.hook.dhcp_reply_options.get_hookimpls())


def _guarded(caller, fallback, **kwargs):
    if not caller.get_hookimpls():  # the common case: nothing to call, no overhead
        return fallback
    try:
        return caller(**kwargs)
    except Exception as exc:
        log.error("dhcp hook failed", hook=caller.name, error=f"{type(exc).__name__}: {exc}")
        return fallback


def lease_json(lease: Lease, now: float) -> dict[str, Any]:
    return {
        "address": str(IPv4Address(lease.address)),
        "mac": lease.hwaddr.hex(":"),
        "client": lease.client.hex(),
        "subnet": lease.subnet,
        "state": lease.state.name.lower(),
        "hostname": lease.hostname,
        "starts": lease.starts,
        "expires": lease.expires,
        "remaining": max(0, round(lease.expires - now)),
    }


plugin = DhcpPlugin()
