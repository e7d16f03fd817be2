"""The ``ra`` plugin: the ``[ra]`` section, the ``ra.responder`` service and its status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from appliance.api import Service, hookimpl
from appliance.config import Config
from appliance.logs import get_logger

from .ndp import Policy
from .schema import SECTION, interfaces
from .service import RaService

if TYPE_CHECKING:
    from appliance.node import Node

log = get_logger("ra")


class RaPlugin:
    def __init__(self) -> None:
        self.settings: Any = None
        self.interfaces: tuple[str, ...] = ()
        self.service: RaService | None = None

    @hookimpl
    def rackboot_config_schema(self):
        return SECTION

    @hookimpl
    def rackboot_configure(self, config: Config) -> None:
        self.settings = config["ra"]
        self.interfaces = interfaces(self.settings, config.sections.get("dhcp"), config.source)

    @hookimpl
    def rackboot_services(self, node: Node) -> list[Service]:
        settings = self.settings
        if not settings.enabled or not self.interfaces:
            log.info("ra not answering",
                     reason="disabled" if not settings.enabled else "no interfaces")  # fmt: skip
            return []
        policy = Policy(settings.mode, settings.listen, settings.router_hold)
        self.service = RaService(self.interfaces, policy)
        return [Service("responder", self.service.run)]

    @hookimpl
    def rackboot_status(self, node: Node) -> dict[str, Any]:
        if self.service is None:
            return {"answering": False}
        links = self.service.status()
        return {
            "answering": any(link.get("state") == "answering" for link in links.values()),
            "mode": self.settings.mode,
            "interfaces": links,
        }


plugin = RaPlugin()
