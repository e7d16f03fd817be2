"""The tftp plugin's hooks: the ``[tftp]`` section, the ``tftp.server`` service, status.

The service answers whatever the node's role: TFTP serves boot files that are
the same on every appliance of a rack (the root directory, the replicated image
store), writes nothing, and a client only reaches the server its DHCP answer
named. A standby that answers a client asking it directly gives the same bytes
the active would. The rack's VIP alone is spoken from only under the lease
(``node.fence``, server.py and pump.py). See docs/tftp.md.
"""

from __future__ import annotations

import ipaddress
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from appliance.api import (
    Field,
    Float,
    Int,
    IPv4Address,
    List,
    Section,
    Service,
    Str,
    hookimpl,
)
from appliance.errors import ConfigError
from appliance.logs import get_logger
from appliance.pluginmanager import call_each
from appliance.schema import Listener

from . import hookspecs
from .negotiate import MAX_WINDOWSIZE, MIN_BLKSIZE
from .packets import MAX_BLKSIZE
from .server import Client, ServerConfig, TftpServer
from .stats import Stats

if TYPE_CHECKING:
    import pluggy

    from appliance.config import Config
    from appliance.node import Node

log = get_logger("tftp")

DEV_ROOT = ""  # the development node serves <data_dir>/tftp/root


@hookimpl
def rackboot_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


SECTION = Section(
    "tftp",
    doc="TFTP server for PXE boot files (read requests only; RFC 1350, 2347-2349, 7440).",
    fields={
        "addresses": Field(
            List(IPv4Address()),
            default=("0.0.0.0",),
            dev_default=("127.0.0.1",),
            doc="Addresses to listen on ('0.0.0.0': all; replies come from the address asked).",
        ),
        "interfaces": Field(
            List(Str(r"[^/\s]{1,15}", "an interface name")),
            default=(),
            doc="Answer only requests arriving on these interfaces (empty: any).",
        ),
        "port": Field(
            Int(min=0, max=65535),
            default=69,
            dev_default=6969,
            doc="UDP port for requests; each transfer uses its own ephemeral port.",
        ),
        "root": Field(
            Str(r"(/.*)?", "an absolute directory path, or '' for <data_dir>/tftp/root"),
            default="/srv/rackboot/tftp",
            dev_default=DEV_ROOT,
            doc="Directory served (created if missing). Symlinks leaving it are refused.",
        ),
        "max_blksize": Field(
            Int(min=MIN_BLKSIZE, max=MAX_BLKSIZE),
            default=MAX_BLKSIZE,
            doc="Largest blksize granted; also clamped to the receiving interface's MTU.",
        ),
        "max_windowsize": Field(
            Int(min=1, max=MAX_WINDOWSIZE),
            default=64,
            doc="Largest windowsize (RFC 7440) granted; bounds per-transfer memory.",
        ),
        "max_transfers": Field(
            Int(min=1, max=100_000),
            default=256,
            doc="Concurrent transfers; requests past it get ERROR 0 'server busy'.",
        ),
        "max_transfers_per_source": Field(
            Int(min=1, max=100_000),
            default=4,
            doc="Transfers one source address may hold before its client acknowledges "
            "anything; more wait their turn.",
        ),
        "retries": Field(
            Int(min=1, max=100),
            default=5,
            doc="Timeouts in a row without progress before a transfer is dropped.",
        ),
        "timeout": Field(
            Float(min=0.05, max=255.0),
            default=1.0,
            doc="First retransmission timeout in seconds (a client's 'timeout' option wins).",
        ),
        "max_timeout": Field(
            Float(min=0.05, max=255.0),
            default=8.0,
            doc="Retransmission timeouts double up to this many seconds.",
        ),
        "busy_poll_us": Field(
            Int(min=0, max=10_000),
            default=200,
            doc="While one transfer runs alone (or is the only acknowledged one among a few), "
            "poll for its ACK this long before sleeping (0: never).",
        ),
    },
    listeners=(Listener("udp", port="port", addresses="addresses"),),
)


@hookimpl
def rackboot_config_schema() -> Section:
    return SECTION


@hookimpl
def rackboot_configure(config: Config) -> None:
    settings = config["tftp"]
    if settings.max_timeout < settings.timeout:
        raise ConfigError(
            config.source, "tftp.max_timeout", f"a number >= tftp.timeout ({settings.timeout})",
            settings.max_timeout,
        )  # fmt: skip
    _check_root(config)


def _check_root(config: Config) -> None:
    """The root must be a directory, or a path the service can create one at (it makes
    the missing part at start-up): a file there, or on the way, fails only then."""
    settings = config["tftp"]
    root = Path(settings.root or Path(config.node.data_dir) / "tftp" / "root")
    existing = root
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        if existing.is_dir():
            return
    except PermissionError:  # a normal user checking root's file: cannot tell, start-up will
        return
    if existing.is_file():
        what = "a regular file"
    elif existing.is_symlink():
        what = "a symbolic link to nothing"
    else:
        what = "not a directory"
    where = f"{existing} is {what}" if existing != root else f"it is {what}"
    raise ConfigError(
        config.source, "tftp.root",
        f"a directory, or a path where one can be created ({where})", str(root),
    )  # fmt: skip


def _log_observer_error(error: Exception) -> None:
    log.error("an observer of served files failed", error=str(error))


def server_config(node: Node) -> ServerConfig:
    settings = node.config["tftp"]
    root = Path(settings.root) if settings.root else node.data_dir / "tftp" / "root"
    return ServerConfig(
        root=root,
        addresses=tuple(ipaddress.IPv4Address(str(a)) for a in settings.addresses),
        port=settings.port,
        interfaces=tuple(settings.interfaces),
        max_blksize=settings.max_blksize,
        max_windowsize=settings.max_windowsize,
        max_transfers=settings.max_transfers,
        max_transfers_per_source=settings.max_transfers_per_source,
        retries=settings.retries,
        timeout=settings.timeout,
        max_timeout=settings.max_timeout,
        busy_poll=settings.busy_poll_us / 1e6,
    )


class _Service:
    """One node's TFTP service: its server, counters and metrics."""

    def __init__(self, node: Node) -> None:
        self.stats = Stats()
        node.metrics.register(self.stats)
        self.config = server_config(node)
        pm = node.pm

        def open_hook(path: str, client: Client) -> Any:
            return pm.hook.tftp_open(path=path, client=client, node=node)

        def served_hook(path: str, client: str) -> None:
            # Each observer on its own: one's bug neither hides the file from the others
            # nor changes the transfer's outcome.
            call_each(
                pm, "tftp_file_served", on_error=_log_observer_error, path=path, client=client
            )

        # The observers are known once plugins are loaded: none, no call per transfer.
        observed = bool(pm.hook.tftp_file_served.get_hookimpls())
        self.server = TftpServer(self.config, self.stats, open_hook, node.fence,
                                 served_hook if observed else None,
                                 log_requests=node.config.node.log_exchanges)  # fmt: skip

    async def run(self, node: Node, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        root = self.config.root
        if not root.is_dir():
            if root.parent == node.data_dir / "tftp":
                node.plugin_dir("tftp")  # the state directory keeps its 0700
            root.mkdir(mode=0o755, parents=True, exist_ok=True)
            log.info("created TFTP root", root=str(root))
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(self.server.serve)
            log.info("listening", addresses=[f"{a}:{p}" for a, p in bound], root=str(root))
            task_status.started()


_services: weakref.WeakKeyDictionary[Node, _Service] = weakref.WeakKeyDictionary()


@hookimpl
def rackboot_services(node: Node) -> list[Service]:
    service = _Service(node)
    _services[node] = service
    return [Service("server", service.run)]


@hookimpl
def rackboot_status(node: Node) -> dict[str, Any] | None:
    service = _services.get(node)
    if service is None:
        return None
    return {
        "listening": [f"{a}:{p}" for a, p in service.server.bound],
        "root": str(service.config.root),
        **service.stats.as_dict(),
    }
