"""The Rackboot node a VM netboots from: ``rackboot run`` with every protocol plugin on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.dhcplab import DhcpNode
from tests.support.netns import Host

_TFTP_OFF = '[plugins]\ndisabled = ["tftp"]\n'


class NetbootNode(DhcpNode):
    """A :class:`DhcpNode` that also serves TFTP (and HTTP boot when configured).

    ``config`` follows ``[dhcp] interfaces = [...]`` in the file: the rest of
    ``[dhcp]`` and then any other sections (``[tftp]``, ``[httpboot]``, ...).
    ``ready`` names the plugins whose status must say they serve before
    :meth:`start` returns."""

    def __init__(self, host: Host, workdir: Path, config: str, *,
                 ready: tuple[str, ...] = ("tftp",)) -> None:  # fmt: skip
        super().__init__(host, workdir, config, name="netboot-node")
        text = self.config.read_text()
        assert _TFTP_OFF in text, "DhcpNode's [plugins] line changed: update NetbootNode"
        self.config.write_text(text.replace(_TFTP_OFF, "[plugins]\ndisabled = []\n"))
        self.ready = ready

    def _serving(self) -> bool:
        if not super()._serving():
            return False
        status = self.status()
        return all(_serves(status.get(plugin, {})) for plugin in self.ready)


def _serves(status: dict[str, Any]) -> bool:
    # TFTP reports its bound addresses; other plugins say "serving".
    return bool(status.get("listening") or status.get("serving"))
