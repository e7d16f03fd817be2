"""The HTTP server: listening sockets, the connection bound, a task per connection (trio shell).

Admission (admission.py decides, this shell applies): a source holding
``max_per_source`` connections, or a full table with nobody to displace, gets a
canned ``503`` with ``Retry-After`` and the connection is closed at once: no
request is read, no task lingers. On a full table a newcomer may displace the
oldest waiting connection of the source holding the most: that connection's
task is cancelled and its socket closed, without an answer (it had no request
in, or was idle between requests).

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

from .admission import Admission, Refused
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
# A booting machine holds one connection at a time (iPXE, UEFI HTTP boot), an installer's
# package manager a few (dnf 3 by default, at most 20; apt 1 per server). 32 leaves room
# for those and for kept-alive leftovers, yet one source takes at most 1/16 of the default
# table of 512. Until [httpboot] has its own setting (max_connections_per_source).
MAX_CONNECTIONS_PER_SOURCE = 32


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
        max_per_source: int = MAX_CONNECTIONS_PER_SOURCE,
    ) -> None:
        self.addresses = addresses
        self.port = port
        self.router = router
        self.limits = limits
        self.stats = stats
        self.admission = Admission(max_connections, min(max_per_source, max_connections))
        self._scopes: dict[int, trio.CancelScope] = {}  # admitted connection -> its task's scope
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
        admission, stats = self.admission, self.stats
        decision = admission.admit(client[0], trio.current_time())
        if isinstance(decision, Refused):
            stats.rejected[decision.reason] += 1
            with trio.move_on_after(BUSY_SEND_SECONDS):
                await stream.send_all(BUSY)
            await stream.aclose()
            return
        conn = decision.conn
        # Registered before the first checkpoint: no other task can pick it as a victim sooner.
        self._scopes[conn] = scope = trio.CancelScope()
        if decision.evict is not None:
            assert decision.evicted_phase is not None
            stats.displaced[decision.evicted_phase] += 1
            self._scopes.pop(decision.evict).cancel()  # its own task closes its socket
        stats.active_connections = len(admission)
        stats.connections += 1
        if hasattr(trio.socket, "TCP_NOTSENT_LOWAT"):
            # trio sets 16 KiB so that a writer wakes only when the socket has nearly
            # drained; a file sent with sendfile then stalls between refills (0.64x nginx
            # for one client). 0 gives back the system's default, as nginx has it.
            with contextlib.suppress(OSError):
                stream.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NOTSENT_LOWAT, 0)
        try:
            with scope:
                local = _name(stream.socket.getsockname())
                guard = None if self.fence is None else self.fence.guard_for(local[0])
                connection = Connection(
                    stream, self.router, self.limits, stats, client, local, self.access_log,
                    guard, partial(self._phase, conn),
                )  # fmt: skip
                await connection.serve()
        finally:
            self._scopes.pop(conn, None)
            admission.release(conn)
            stats.active_connections = len(admission)  # (displaced: Connection.serve closed it)

    def _phase(self, conn: int, phase: str) -> None:
        self.admission.mark(conn, phase, trio.current_time())


async def _guarded(handler, stream: trio.SocketStream) -> None:
    """A connection's failure ends that connection, never the server."""
    try:
        await handler(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await stream.aclose()
    except Exception as exc:
        log.error("connection failed", error=f"{type(exc).__name__}: {exc}")
        await stream.aclose()
