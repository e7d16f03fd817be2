"""The images plugin's hooks: ``[images]``, the store service, serving by name, the CLI.

The per-node work is service.py's (store, signing, sync follower, control
handlers); the HTTP routes are routes.py's; the command line commands.py's.
See docs/images.md.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from appliance.api import Bool, CliCommand, Field, Int, List, Section, Service, Str, hookimpl
from appliance.errors import ConfigError
from plugins.httpboot.messages import Route

from .commands import cli_commands
from .routes import ImageRoutes
from .service import ImageService, chunk_params

if TYPE_CHECKING:
    from appliance.config import Config
    from appliance.node import Node

SERVED_PREFIX = "images/"  # TFTP: images/NAME; HTTP: /images/NAME

SECTION = Section(
    "images",
    doc="Boot images: a signed chunk store, served by name (see docs/images.md).",
    fields={
        "enabled": Field(Bool(), default=True, doc="Keep an image store on this node."),
        "root": Field(
            Str(r"(/.{0,4000})?", "'' or an absolute path", max_len=4096),
            default="",
            doc="Where the store lives ('' = <data_dir>/images).",
        ),
        "min_chunk": Field(
            Int(min=64, max=1 << 20),
            default=16 * 1024,
            doc="Smallest chunk in bytes (content-defined chunking).",
        ),  # fmt: skip
        "avg_chunk": Field(
            Int(min=256, max=4 << 20),
            default=64 * 1024,
            doc="Average chunk in bytes (smaller for filesystem images).",
        ),  # fmt: skip
        "max_chunk": Field(
            Int(min=1024, max=16 << 20), default=256 * 1024, doc="Largest chunk in bytes."
        ),  # fmt: skip
        "peers": Field(
            List(
                Str(r"[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}", "a 'host:port' address", max_len=260),
                max_items=16,
            ),
            default=(),
            doc="HTTP boot servers of the appliances to sync images from ('host:port'); "
            "empty: the hosts of [ha] peers, at this node's [httpboot] port.",
        ),
        "max_rate": Field(
            Int(min=0, max=1 << 40),
            default=0,
            doc="Bytes per second a sync may fetch, all peers together (0: no limit).",
        ),
        "keep_versions": Field(
            Int(min=1, max=1000),
            default=2,
            doc="Versions of each image `image gc` keeps, the current one included.",
        ),  # fmt: skip
    },
)


class ImagesPlugin:
    def __init__(self) -> None:
        self.stores: weakref.WeakKeyDictionary[Node, ImageService] = weakref.WeakKeyDictionary()

    @hookimpl
    def rackboot_config_schema(self) -> Section:
        return SECTION

    @hookimpl
    def rackboot_configure(self, config: Config) -> None:
        settings = config["images"]
        why = chunk_params(settings).problem()
        if why is not None:
            raise ConfigError(config.source, "images.avg_chunk",
                              f"min_chunk <= avg_chunk <= max_chunk within pyfastcdc's limits "
                              f"({why})",
                              [settings.min_chunk, settings.avg_chunk, settings.max_chunk])  # fmt: skip

    @hookimpl
    def rackboot_services(self, node: Node) -> list[Service]:
        if not node.config["images"].enabled:
            return []
        state = ImageService(node)
        self.stores[node] = state
        return [Service("store", state.run)]

    @hookimpl
    def rackboot_status(self, node: Node) -> dict[str, Any] | None:
        state = self.stores.get(node)
        return None if state is None else state.status()

    @hookimpl
    def rackboot_control_commands(self, node: Node):
        state = self.stores.get(node)
        if state is None:
            return None
        return {
            "images.add": state.add, "images.list": state.list, "images.show": state.show,
            "images.verify": state.verify, "images.rm": state.remove, "images.gc": state.gc,
        }  # fmt: skip

    # -- serving by name (optional: the tftp and httpboot plugins may be disabled) --

    @hookimpl(optionalhook=True)
    def tftp_open(self, path: str, node: Node) -> Path | None:
        """``images/NAME``: the current version of image NAME (a lookup, no I/O)."""
        state = self.stores.get(node)
        name = path.removeprefix(SERVED_PREFIX) if path.startswith(SERVED_PREFIX) else None
        return None if state is None or name is None else state.store.served_path(name)

    @hookimpl(optionalhook=True)
    def httpboot_routes(self, node: Node) -> list[Route] | None:
        state = self.stores.get(node)
        if state is None:
            return None
        return ImageRoutes(state).routes()

    @hookimpl
    def rackboot_cli_commands(self) -> list[CliCommand]:
        return cli_commands()

    @hookimpl
    def rackboot_doctor_checks(self, options) -> list:
        from .doctor import CHECKS  # the doctor's process only

        return CHECKS


plugin = ImagesPlugin()
