"""The rackinfo plugin: every machine of the rack learns where it stands and how far its
installation got, over DHCP, TFTP and HTTP; the rack remembers it through failovers.

docs/plugin-authoring.md builds this module step by step. Hooks are synchronous and
quick; the one slow thing (a write to the replicated state) happens in a service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio
from appliance.api import CliCommand, Field, Int, Section, Service, Str, get_logger, hookimpl
from appliance.state.store import NotWriter

from rackboot_rackinfo.commands import COMMANDS
from rackboot_rackinfo.wire import (
    SUB_LOCATION,
    SUB_STATE,
    VIVSO,
    encode_vivso,
    mac_of_file_untrusted,
    render_file,
    state_text,
)

if TYPE_CHECKING:
    from appliance.api import PluginNode

NS = "rackinfo.machines"  # key: the MAC; value: the machine's last installer event
QUEUE = 256  # installer events waiting to be written; past it they are dropped and counted
log = get_logger("rackinfo")

SECTION = Section(
    "rackinfo",
    doc="Tells each machine the rack's location and its install state (DHCP option 125, "
    "TFTP rackinfo/MAC.txt, HTTP /api/v1/rackinfo).",
    fields={
        "location": Field(
            Str(r"[ -~]{0,200}", "printable ASCII, at most 200 characters"),
            default="",
            doc="Where this rack stands, e.g. 'dc1/row4/rack7' ('' = no DHCP option).",
        ),
        "enterprise": Field(
            Int(min=1, max=2**32 - 1),
            default=32473,
            doc="IANA enterprise number of option 125 (32473 is RFC 5612's example).",
        ),
    },
)


class RackInfo:
    """One object per process, registered with the node's plugin manager (the core runs
    one node per process; tests start one at a time)."""

    def __init__(self) -> None:
        self.node: PluginNode | None = None
        self.settings: Any = None
        self.send: trio.MemorySendChannel[tuple[str, dict[str, Any]]] | None = None
        self.counts = {"recorded": 0, "dropped": 0, "refused": 0}

    # -- 1. configuration ---------------------------------------------------------

    @hookimpl
    def rackboot_config_schema(self) -> Section:
        return SECTION

    # -- 2. a service: the one place that writes state ----------------------------------

    @hookimpl
    def rackboot_services(self, node: PluginNode) -> list[Service]:
        self.node, self.settings = node, node.config["rackinfo"]
        self.counts = dict.fromkeys(self.counts, 0)
        return [Service("recorder", self.recorder)]

    async def recorder(self, node: PluginNode, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        send, receive = trio.open_memory_channel[tuple[str, dict[str, Any]]](QUEUE)
        self.send = send
        task_status.started()  # nothing to bind: ready at once
        async with receive:
            async for mac, record in receive:
                try:
                    # Committed: durable here and acknowledged by the rack's standby.
                    await node.state.put(NS, mac, record)
                    self.counts["recorded"] += 1
                except NotWriter:
                    # The lease moved on between the event and the write: the new active
                    # has the event (httpboot recorded it) but not our summary of it.
                    self.counts["refused"] += 1
                    log.warning("not the writer: event not summarised", mac=mac)

    # -- 3. reacting to provisioning: an installer's event ---------------------------

    @hookimpl(optionalhook=True)
    def httpboot_machine_event(self, event: Any) -> None:
        # Called on the active, in the node's trio thread, once the event committed: hand
        # it to the service (a hook must not wait), never block here.
        record = {"stage": event.stage, "status": event.status, "seq": event.seq,
                  "time": event.time}  # fmt: skip
        try:
            if self.send is not None:
                self.send.send_nowait((event.mac, record))
        except trio.WouldBlock:
            self.counts["dropped"] += 1

    def record_of(self, mac: str) -> dict[str, Any] | None:
        """The committed record (the same on every appliance of the rack): memory only."""
        return None if self.node is None else self.node.state.get(NS, mac)

    # -- 4. a vendor DHCP option ------------------------------------------------------

    @hookimpl(optionalhook=True)
    def dhcp_reply_options(self, request: Any, reply: Any, lease: Any) -> None:
        # Only to clients that ask for option 125 (RFC 3925 says so), only with a location.
        if self.settings is None or not self.settings.location:
            return
        if VIVSO not in request.parameter_request_list or request.mac is None:
            return
        subs = {SUB_LOCATION: self.settings.location.encode(),
                SUB_STATE: state_text(self.record_of(request.mac)).encode()}  # fmt: skip
        reply.options[VIVSO] = encode_vivso(self.settings.enterprise, subs)

    # -- 5. a dynamic TFTP file ---------------------------------------------------------

    @hookimpl(optionalhook=True)
    def tftp_open(self, path: str, client: Any, node: PluginNode) -> bytes | None:
        mac = mac_of_file_untrusted(path)  # the name is untrusted: match, never join
        if mac is None or self.settings is None:
            return None  # not ours: the next implementation, then the TFTP root, answers
        return render_file(self.settings.location, mac, self.record_of(mac))

    # -- 6. HTTP routes -------------------------------------------------------------------

    @hookimpl(optionalhook=True)
    def httpboot_routes(self, node: PluginNode) -> list[Any]:
        from plugins.httpboot.messages import Response, Route

        def everything(request: Any) -> Response:
            machines = dict(node.state.scan(NS))
            return Response.json({"location": self.settings.location, "machines": machines})

        def one(request: Any) -> Response:
            mac = request.params["mac"].lower().replace("-", ":")
            record = node.state.get(NS, mac)
            return Response.json({"mac": mac, **record}) if record else Response.error(404)

        return [Route("GET", "/api/v1/rackinfo", everything),
                Route("GET", "/api/v1/rackinfo/{mac}", one)]  # fmt: skip

    # -- 7. status, a control command and its CLI command ----------------------------

    @hookimpl
    def rackboot_status(self, node: PluginNode) -> dict[str, Any] | None:
        if self.settings is None:
            return None
        machines = sum(1 for _ in node.state.scan(NS))
        return {"location": self.settings.location, "machines": machines, **self.counts}

    @hookimpl
    def rackboot_control_commands(self, node: PluginNode) -> dict[str, Any]:
        return {"rackinfo.machines": lambda args: dict(node.state.scan(NS))}

    @hookimpl
    def rackboot_cli_commands(self) -> list[CliCommand]:
        return COMMANDS  # also declared in pyproject.toml's rackboot.cli (commands.py)


plugin = RackInfo()
