"""Hooks of the relay plugin, for a DHCP server in the same process.

Implement with ``@hookimpl(optionalhook=True)`` from :mod:`appliance.api` (the hook
exists only while the relay plugin is loaded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from appliance.api import hookspec

if TYPE_CHECKING:
    from collections.abc import Callable


class LocalServer(Protocol):
    """A DHCP server running in this process, as the relay sees it."""

    def serves(self, address: int) -> bool:
        """Does it answer at ``address`` now (an address of this node it serves at, the
        rack's VIP while it holds it)? Then requests for it are handed over in process:
        sent, they would come back through the loopback and reach no socket of it."""

    def inject(self, payload: bytes, address: int) -> None:
        """Handle a relayed request sent to ``address`` as if it had arrived."""

    def attach_relay(self, owns: Callable[[int], bool],
                     deliver: Callable[[bytes, int | None], None]) -> None:  # fmt: skip
        """Replies for a ``giaddr`` the relay ``owns`` go to ``deliver(payload, source)``:
        the server's own with ``source`` None, those its sockets received from another
        server with that server's address (the relay checks it is one of its servers)."""


@hookspec(firstresult=True)
def relay_local_server() -> LocalServer | None:
    """The DHCP server of this process, if one runs: the relay then hands requests for
    the addresses it serves at to it directly, and takes its replies (and replies for
    the relay the server's sockets receive) directly.

    :return: An object with :class:`LocalServer`'s methods, or ``None``.
    """
