"""The Rackboot node a VM netboots from: ``rackboot run`` with every protocol plugin on."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.dhcplab import DhcpNode
from tests.support.netns import Host

_PLUGINS_OFF = re.compile(r"^\[plugins\]\ndisabled = \[.*\]\n", re.MULTILINE)


class NetbootNode(DhcpNode):
    """A :class:`DhcpNode` that also serves TFTP (and HTTP boot when configured).

    ``config`` follows ``[dhcp] interfaces = [...]`` in the file: the rest of
    ``[dhcp]`` and then any other sections (``[tftp]``, ``[httpboot]``, ...).
    ``ready`` names the plugins whose status must list a bound address before
    :meth:`start` returns."""

    def __init__(self, host: Host, workdir: Path, config: str, *,
                 ready: tuple[str, ...] = ("tftp",)) -> None:  # fmt: skip
        super().__init__(host, workdir, config, name="netboot-node")
        text, found = _PLUGINS_OFF.subn("[plugins]\ndisabled = []\n", self.config.read_text())
        assert found == 1, "DhcpNode's [plugins] section changed: update NetbootNode"
        self.config.write_text(text)
        self.ready = ready

    def _serving(self) -> bool:
        if not super()._serving():
            return False
        status = self.status()  # TFTP and HTTP boot list their bound addresses
        return all(status.get(plugin, {}).get("listening") for plugin in self.ready)
