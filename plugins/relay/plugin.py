"""The ``relay`` plugin: the ``[relay]`` section, the ``relay.agent`` service, status and
metrics. The relay keeps no state, so every appliance may run it (``when =
"always"``), or only the one holding the rack's lease (``when = "active"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily

from appliance.api import Role, Service, hookimpl
from appliance.config import Config
from appliance.logs import get_logger
from plugins.dhcp.netio import interface_address

from . import hookspecs
from .agent import RelayAgent
from .schema import SECTION, check_beside_dhcp, relay_config
from .service import RelayService

if TYPE_CHECKING:
    import pluggy

    from appliance.node import Node

log = get_logger("relay")


class RelayPlugin:
    def __init__(self) -> None:
        self.settings: Any = None
        self.source = ""
        self.service: RelayService | None = None
        self.pm: pluggy.PluginManager | None = None

    @hookimpl
    def rackboot_addhooks(self, pluginmanager: pluggy.PluginManager) -> None:
        pluginmanager.add_hookspecs(hookspecs)
        self.pm = pluginmanager

    @hookimpl
    def rackboot_config_schema(self):
        return SECTION

    @hookimpl
    def rackboot_configure(self, config: Config) -> None:
        self.settings, self.source = config["relay"], config.source
        # What does not depend on the interfaces' addresses is checked now (config check)
        relay_config(self.settings, self.source, {i.name: 1 for i in self.settings.interfaces})
        check_beside_dhcp(self.settings, config.sections.get("dhcp"), self.source)

    @hookimpl
    def rackboot_services(self, node: Node) -> list[Service]:
        settings = self.settings
        if not settings.servers or not settings.interfaces:
            return []

        def make_agent() -> RelayAgent:
            addresses = {i.name: interface_address(i.name) for i in settings.interfaces}
            return RelayAgent(relay_config(settings, self.source, addresses))

        pm = self.pm
        assert pm is not None
        self.service = RelayService(make_agent, settings.port, settings.client_port,
                                    relaying=self._relays(node.role),
                                    find_local=pm.hook.relay_local_server)  # fmt: skip
        node.metrics.register(_Collector(self))
        return [Service("agent", self.service.run)]

    def _relays(self, role: Role) -> bool:
        return self.settings.when == "always" or role is Role.ACTIVE

    @hookimpl
    def rackboot_role_changed(self, node: Node, old: Role, new: Role) -> None:
        if self.service is not None:
            self.service.set_relaying(self._relays(new))

    @hookimpl
    def rackboot_status(self, node: Node) -> dict[str, Any]:
        service = self.service
        agent = service.agent if service is not None else None
        if service is None or agent is None:
            return {"relaying": False}
        return {
            "relaying": service.relaying,
            "when": self.settings.when,
            "servers": [str(s) for s in self.settings.servers],
            "interfaces": {
                link.name: {
                    "address": _text(link.address),
                    "requests": agent.requests[link.name],
                    "replies": agent.replies[link.name],
                    # broadcasts and replies to clients without an address leave as
                    # frames through a packet socket
                    "frames": service.frames.uses_frames(link.name),
                }
                for link in agent.config.links
            },
            "dropped": dict(agent.dropped),
            "option82_skipped": agent.option82_skipped,
            "send_errors": service.send_errors,
            "frames_refused": service.frames.refused,  # by the packet socket: sendmsg instead
            "arp_refused": service.arp_refused,
        }


class _Collector:
    """The agent's counters as Prometheus families, read when scraped (the agent counts
    with plain integers on its hot path)."""

    def __init__(self, plugin: RelayPlugin) -> None:
        self.plugin = plugin

    def collect(self):
        service = self.plugin.service
        agent = service.agent if service is not None else None
        families = {
            "rackboot_relay_requests": ("Requests forwarded, by interface", "interface"),
            "rackboot_relay_replies": ("Replies delivered, by interface", "interface"),
            "rackboot_relay_dropped": ("Datagrams dropped, by reason", "reason"),
        }
        counts = (agent.requests, agent.replies, agent.dropped) if agent else ({}, {}, {})
        for (name, (doc, label)), values in zip(families.items(), counts, strict=True):
            family = CounterMetricFamily(name, doc, labels=[label])
            for key, value in sorted(values.items()):
                family.add_metric([key], value)
            yield family


def _text(address: int) -> str:
    return ".".join(str(b) for b in address.to_bytes(4, "big"))


plugin = RelayPlugin()
