"""The ``provisioning`` plugin: the workflow of plugins/provisioning/lifecycle.py on the
rack's state, fed by the DHCP server's committed leases and the installers' events,
acting through the ``provisioning_power`` hook; ``rackboot machines ...``."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram

from appliance.api import Role, Service, hookimpl
from appliance.config import Config
from appliance.control import ControlRequestError
from appliance.logs import get_logger
from plugins.httpboot.script import Profile, render_ipxe

from . import hookspecs
from .commands import cli_commands
from .lifecycle import STAGES, Actions, Record, Workflow
from .observe import LOCAL, check_profiles, classify, mac_leased_at, profile_for, profiles_of
from .schema import SECTION, seed_records, timeouts
from .service import ProvisioningService

if TYPE_CHECKING:
    import pluggy

    from appliance.node import Node

log = get_logger("provisioning")


class Metrics:
    def __init__(self, registry: Any) -> None:
        self.attempts = Counter("rackboot_provisioning_attempts", "Provisioning attempts started",
                                registry=registry)  # fmt: skip
        self.successes = Counter("rackboot_provisioning_successes", "Machines provisioned",
                                 registry=registry)  # fmt: skip
        self.failures = Counter("rackboot_provisioning_failures",
                                "Failed attempts, by stage and reason (timeout, installer)",
                                ["stage", "reason"], registry=registry)  # fmt: skip
        self.spares = Counter("rackboot_provisioning_spares_used",
                              "Spares that took a failed machine's profile", registry=registry)  # fmt: skip
        self.seconds = Histogram("rackboot_provisioning_seconds",
                                 "Seconds from the request to provisioned", registry=registry,
                                 buckets=(60, 120, 300, 600, 900, 1200, 1800, 3600, 7200))  # fmt: skip
        self.power = Counter("rackboot_provisioning_power_actions",
                             "Power actions, by action and result", ["action", "result"],
                             registry=registry)  # fmt: skip

    def count(self, actions: Actions) -> None:
        if actions.attempts:
            self.attempts.inc(actions.attempts)
        for seconds in actions.successes:
            self.successes.inc()
            self.seconds.observe(seconds)
        for stage, reason in actions.failures:
            self.failures.labels(stage, reason).inc()
        if actions.spares_used:
            self.spares.inc(actions.spares_used)

    def powered(self, action: str, done: bool) -> None:
        self.power.labels(action, "done" if done else "not_done").inc()


class ProvisioningPlugin:
    def __init__(self) -> None:
        self.pm: pluggy.PluginManager | None = None
        self.settings: Any = None
        self.seeds: list[Record] = []
        self.flow: Workflow | None = None
        self.service: ProvisioningService | None = None
        self.node: Node | None = None
        self.profiles: dict[str, Profile] = {}  # [httpboot] profiles by name
        self.default_profile = ""

    @hookimpl
    def rackboot_addhooks(self, pluginmanager: pluggy.PluginManager) -> None:
        pluginmanager.add_hookspecs(hookspecs)
        self.pm = pluginmanager

    @hookimpl
    def rackboot_config_schema(self):
        return SECTION

    @hookimpl
    def rackboot_configure(self, config: Config) -> None:
        self.settings = config["provisioning"]
        self.seeds = seed_records(self.settings, config.source)
        if "httpboot" in config.sections:
            self.profiles, self.default_profile = profiles_of(config["httpboot"])
            check_profiles(self.seeds, self.profiles, config.source)

    @hookimpl
    def rackboot_services(self, node: Node) -> list[Service]:
        settings = self.settings
        self.node = node
        self.flow = Workflow(timeouts(settings), settings.retries, settings.strategy)
        pm = self.pm
        assert pm is not None

        def power(record: Record, action: str) -> bool:
            return bool(pm.hook.provisioning_power(machine=record, action=action))

        self.service = ProvisioningService(node.state, self.flow, self.seeds, power,
                                           Metrics(node.metrics), node.fence.ok)  # fmt: skip
        return [Service("workflow", self.service.run)]

    @hookimpl
    def rackboot_role_changed(self, node: Node, old: Role, new: Role) -> None:
        if self.service is not None:
            self.service.set_active(new is Role.ACTIVE)

    # -- observations (hooks of the dhcp and httpboot plugins, on the active) -------------

    def _acting(self) -> bool:
        return self.flow is not None and self.service is not None and self.service.acting

    @hookimpl(optionalhook=True)
    def dhcp_lease_committed(self, lease) -> None:
        if self._acting():
            mac = lease.hwaddr.hex(":")
            self.service.observe(self.flow.dhcp(mac, time.time()))

    @hookimpl(optionalhook=True)
    def httpboot_machine_event(self, event) -> None:
        if self._acting():
            self.service.observe(self.flow.installer(event.mac, installer_status(event),
                                                     time.time(), event.message))  # fmt: skip

    @hookimpl(optionalhook=True)
    def httpboot_file_served(self, path: str, client: str) -> None:
        self._fetched(path, client)

    @hookimpl(optionalhook=True)
    def tftp_file_served(self, path: str, client: str) -> None:
        self._fetched(path, client)

    def _fetched(self, path: str, client: str) -> None:
        if not self._acting() or not self.flow.machines or self.node is None:
            return
        mac = mac_leased_at(self.node.state, client)
        record = None if mac is None else self.flow.machine_of(mac)
        if record is None:
            return
        profile = profile_for(record.profile, self.profiles, self.default_profile)
        if profile is None:
            return
        kind = classify(path, profile)
        self.service.observe(self.flow.fetched(mac, kind, time.time(), len(profile.initrd)))

    @hookimpl(optionalhook=True)
    def httpboot_boot_script(self, machine, default: str) -> str | None:
        """A machine of the inventory boots its record's profile while it is being
        provisioned (the script fetched: its loader stage), its local disk otherwise:
        an installer that reboots at its end does not install again."""
        record = None if self.flow is None else self.flow.machine_of(machine.mac)
        if record is None:
            return None
        if record.state not in STAGES[:-1]:
            return render_ipxe(replace(machine, profile=LOCAL))
        if self._acting():
            self.service.observe(self.flow.fetched(machine.mac, "loader", time.time()))
        profile = profile_for(record.profile, self.profiles, self.default_profile)
        if profile is None or profile == machine.profile:
            return None
        return render_ipxe(replace(machine, profile=profile))

    # -- status, control, CLI -------------------------------------------------------------

    @hookimpl
    def rackboot_status(self, node: Node) -> dict[str, Any]:
        if self.flow is None or self.service is None:
            return {"machines": 0}
        states: dict[str, int] = {}
        for record in self.flow.machines.values():
            states[record.state] = states.get(record.state, 0) + 1
        return {"machines": len(self.flow.machines), "states": states,
                "refused": self.service.refused}  # fmt: skip

    @hookimpl
    def rackboot_control_commands(self, node: Node):
        return {
            "machines.list": self._list,
            "machines.show": self._show,
            "machines.reprovision": self._reprovision,
            "machines.pool": self._pool,
        }

    @hookimpl
    def rackboot_cli_commands(self):
        return cli_commands()

    def _list(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        flow = self.flow
        return [] if flow is None else [_summary(r) for _, r in sorted(flow.machines.items())]

    def _show(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._record(args).to_dict()

    async def _reprovision(self, args: dict[str, Any]) -> dict[str, Any]:
        record = self._record(args)
        profile = args.get("profile")
        if profile is not None and not isinstance(profile, str):
            raise ControlRequestError("profile must be text")
        if profile is not None and self.profiles and profile not in self.profiles:
            known = ", ".join(sorted(self.profiles))
            raise ControlRequestError(f"no boot profile named {profile!r} (known: {known})")
        self._writer_only("machines reprovision")
        assert self.flow is not None and self.service is not None
        self.service.observe(self.flow.request(record.name, time.time(), profile))
        return self.flow.machines[record.name].to_dict()

    async def _pool(self, args: dict[str, Any]) -> dict[str, Any]:
        record = self._record(args)
        pool = args.get("pool")
        if not isinstance(pool, str):
            raise ControlRequestError("pool must be text")
        self._writer_only("machines pool")
        assert self.flow is not None and self.service is not None
        state = "spare" if args.get("spare") and pool else (
            "idle" if record.state == "spare" else record.state)  # fmt: skip
        changed = replace(record, pool=pool, state=state)
        self.flow.load(changed)
        self.service.observe(Actions(saves=[changed]))
        return changed.to_dict()

    def _record(self, args: dict[str, Any]) -> Record:
        name = args.get("name")
        if not isinstance(name, str) or self.flow is None or name not in self.flow.machines:
            raise ControlRequestError(f"no machine named {name!r}")
        return self.flow.machines[name]

    def _writer_only(self, what: str) -> None:
        if self.node is None or not self.node.fence.ok():
            raise ControlRequestError(f"{what} changes the rack's state: run it on the active "
                                      "appliance (this one does not hold the rack's lease)")  # fmt: skip


def installer_status(event: Any) -> str:
    """An event's meaning for the workflow: the installer ``failed``, is done (``ok`` of a
    final stage: ``installed``, ``provisioned`` or ``done``), ``started`` or alive."""
    if event.status == "failed":
        return "failed"
    if event.status == "ok" and event.stage in FINAL_STAGES:
        return "ok"
    return "started" if event.status == "started" else "progress"


FINAL_STAGES = frozenset({"installed", "provisioned", "done"})


def _summary(record: Record) -> dict[str, Any]:
    return {"name": record.name, "state": record.state, "profile": record.profile,
            "pool": record.pool, "attempt": record.attempt, "deadline": record.deadline,
            "deprovision": record.deprovision, "macs": list(record.macs)}  # fmt: skip


plugin = ProvisioningPlugin()
