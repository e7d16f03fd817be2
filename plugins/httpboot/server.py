"""The HTTP server: listening sockets, the connection bound, a task per connection (trio shell).

Past ``max_connections`` open connections a new one gets a canned ``503`` with
``Retry-After`` and is closed at once: no request is read, no task lingers.

A connection accepted on the rack's VIP (``fence.vip``, the address it was sent
to) is served only while this node holds the lease: it gets ``fence.ok`` as its
guard (connection.py). Connections to the node's own addresses are served
whatever its role.
"""

from __future__ import annotations

import contextlib
import ipaddress
from functools import partial
from typing import TYPE_CHECKING

import trio

from appliance.logs import get_logger

from .connection import Connection, Limits
from .router import Router
from .stats import Stats

if TYPE_CHECKING:
    from appliance.ha.fence import Fence

log = get_logger("httpboot")

BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"server: rackboot\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"retry-after: 1\r\ncontent-length: 24\r\nconnection: close\r\n\r\n"
    b"503 Service Unavailable\n"
)
BUSY_SEND_SECONDS = 1.0


def _name(sockname: tuple) -> tuple[str, int]:
    return str(sockname[0]), int(sockname[1])


class HttpServer:
    def __init__(
        self,
        addresses: tuple[ipaddress.IPv4Address, ...],
        port: int,
        router: Router,
        limits: Limits,
        stats: Stats,
        max_connections: int,
        access_log: bool = True,
        fence: Fence | None = None,
    ) -> None:
        self.addresses = addresses
        self.port = port
        self.router = router
        self.limits = limits
        self.stats = stats
        self.max_connections = max_connections
        self.access_log = access_log
        self.fence = fence  # node.fence: the VIP is answered on only under the lease
        self.bound: list[tuple[str, int]] = []

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners: list[trio.SocketListener] = []
        try:
            for address in self.addresses:
                listeners += await trio.open_tcp_listeners(self.port, host=str(address))
        except BaseException:
            for listener in listeners:
                await listener.aclose()
            raise
        self.bound = [_name(listener.socket.getsockname()) for listener in listeners]
        await trio.serve_listeners(
            partial(_guarded, self._connection), listeners, task_status=task_status
        )

    async def _connection(self, stream: trio.SocketStream) -> None:
        client = _name(stream.socket.getpeername())
        if self.stats.active_connections >= self.max_connections:
            self.stats.rejected_connections += 1
            with trio.move_on_after(BUSY_SEND_SECONDS):
                await stream.send_all(BUSY)
            await stream.aclose()
            return
        self.stats.active_connections += 1
        self.stats.connections += 1
        if hasattr(trio.socket, "TCP_NOTSENT_LOWAT"):
            # trio sets 16 KiB so that a writer wakes only when the socket has nearly
            # drained; a file sent with sendfile then stalls between refills (0.64x nginx
            # for one client). 0 gives back the system's default, as nginx has it.
            with contextlib.suppress(OSError):
                stream.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NOTSENT_LOWAT, 0)
        try:
            local = _name(stream.socket.getsockname())
            guard = None if self.fence is None else self.fence.guard_for(local[0])
            connection = Connection(
                stream, self.router, self.limits, self.stats, client, local, self.access_log, guard
            )
            await connection.serve()
        finally:
            self.stats.active_connections -= 1


async def _guarded(handler, stream: trio.SocketStream) -> None:
    """A connection's failure ends that connection, never the server."""
    try:
        await handler(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await stream.aclose()
    except Exception as exc:
        log.error("connection failed", error=f"{type(exc).__name__}: {exc}")
        await stream.aclose()
