"""The ``redfish`` power plugin: it powers the machines whose ``power`` address is
``redfish://`` (or ``redfish+http://``) through their BMC's Redfish API, for the
provisioning workflow's ``provisioning_power`` hook (docs/power.md).

Other machines are not its own (None). A Redfish machine whose BMC has no
``[[redfish.bmcs]]`` entry, a malformed address or a failed request: False, logged
with the reason and counted in ``rackboot_redfish_failures_total{reason}``.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from appliance.api import Service, hookimpl
from appliance.config import Config
from appliance.logs import get_logger

from .redfish_client import PowerError, take
from .redfish_config import SECTION, Bmc, bmcs
from .redfish_core import ACTIONS, AddressError, target_of

if TYPE_CHECKING:
    from appliance.node import Node

log = get_logger("redfish")


class Metrics:
    def __init__(self, registry: Any) -> None:
        self.actions = Counter("rackboot_redfish_actions",
                               "Power actions through a BMC, by action and result "
                               "(reset, unchanged: already there, failed)",
                               ["action", "result"], registry=registry)  # fmt: skip
        self.failures = Counter("rackboot_redfish_failures",
                                "Failed power actions, by reason", ["reason"],
                                registry=registry)  # fmt: skip


class RedfishPlugin:
    def __init__(self) -> None:
        self.timeout = 10.0
        self.bmcs: dict[str, Bmc] = {}
        self.metrics: Metrics | None = None

    @hookimpl
    def rackboot_config_schema(self):
        return SECTION

    @hookimpl
    def rackboot_configure(self, config: Config) -> None:
        settings = config["redfish"]
        self.timeout = settings.timeout
        self.bmcs = bmcs(settings, config.source)
        for bmc in self.bmcs.values():
            if bmc.tls.verify_mode == ssl.CERT_NONE:
                log.warning("BMC certificate not verified (verify_tls = false)", bmc=bmc.address)

    @hookimpl
    def rackboot_services(self, node: Node) -> list[Service]:
        self.metrics = Metrics(node.metrics)
        return []

    @hookimpl
    def rackboot_status(self, node: Node) -> dict[str, Any]:
        return {"bmcs": sorted(self.bmcs)}

    @hookimpl(optionalhook=True)  # a hook of the provisioning plugin, if it is enabled
    def provisioning_power(self, machine: Any, action: str) -> bool | None:
        try:
            target = target_of(machine.power)
        except AddressError as exc:
            return self._failed(machine.name, action, "address", f"power address: {exc}")
        if target is None:
            return None
        if action not in ACTIONS:
            return self._failed(machine.name, action, "action", f"unknown action {action!r}")
        bmc = self.bmcs.get(target.bmc)
        if bmc is None:
            return self._failed(machine.name, action, "unknown_bmc",
                                f"no [[redfish.bmcs]] entry with address = {target.bmc!r}")  # fmt: skip
        try:
            outcome = take(bmc, target, action, self.timeout)
        except PowerError as exc:
            return self._failed(machine.name, action, exc.reason, exc.detail, bmc=target.bmc)
        result = "unchanged" if outcome.reset is None else "reset"
        log.info("power action taken", machine=machine.name, action=action, bmc=target.bmc,
                 system=target.path, was=outcome.power_state, reset=outcome.reset)  # fmt: skip
        if self.metrics is not None:
            self.metrics.actions.labels(action, result).inc()
        return True

    def _failed(self, name: str, action: str, reason: str, detail: str, **where: str) -> bool:
        log.error("power action failed", machine=name, action=action, reason=reason,
                  detail=detail, **where)  # fmt: skip
        if self.metrics is not None:
            self.metrics.actions.labels(action, "failed").inc()
            self.metrics.failures.labels(reason).inc()
        return False


plugin = RedfishPlugin()
