"""The HTTP server: listening sockets, the connection bound, a task per connection (trio shell).

Admission (admission.py decides, this shell applies): a source holding
``max_per_source`` connections, or a full table with nobody to displace, gets a
canned ``503`` with ``Retry-After`` and the connection is closed in the accept
loop itself: no task, nothing awaited, so a flood that reconnects as fast as it
is refused costs one accept, one write, one read and one close per connection. On a full table a newcomer may displace the
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
import errno
import ipaddress
import os
import socket
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import trio

from appliance.logs import LineBatch, get_logger

from .admission import Admission, Refused
from .connection import Connection, Limits, access
from .lane import Lane
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
# A connection reset or refused on its way in: nothing to serve (as trio's listener has it).
# fmt: off
_IGNORABLE_ACCEPT_ERRNOS = {
    getattr(errno, name)
    for name in ("EPERM", "ECONNABORTED", "EPROTO", "ENETDOWN", "ENOPROTOOPT", "EHOSTDOWN",
                 "ENONET", "EHOSTUNREACH", "EOPNOTSUPP", "ENETUNREACH", "ENOSR",
                 "ESOCKTNOSUPPORT", "EPROTONOSUPPORT", "ETIMEDOUT", "ECONNRESET")
    if hasattr(errno, name)
}
# fmt: on
ACCESS_FLUSH_SECONDS = 0.2  # an access line waits at most this long to be written
ACCEPT_BATCH = 64  # connections taken after one wait: bounds the loop's turn (~2 ms)
REFUSE_DRAIN = 16 << 10  # bytes of a refused connection's request read before it is closed
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
        # admitted by the accept loop, by descriptor until its task starts: (conn, scope, client)
        self._admitted: dict[int, tuple[int, trio.CancelScope, tuple[str, int]]] = {}
        # Access lines written together (a write per request cost more than its file):
        # within ACCESS_FLUSH_SECONDS of the first one waiting, and when the server stops.
        self.access = LineBatch(access, on_first=self._access_waiting) if access_log else None
        self._access_lines = trio.Event()
        self.fence = fence  # node.fence: the VIP is answered on only under the lease
        # httpboot_file_served(path, client), set at the service's start if a plugin
        # implements it; None costs nothing per request.
        self.file_served: Callable[[str, str], object] | None = None
        self.bound: list[tuple[str, int]] = []
        self.lane: Lane | None = None  # kept-alive connections between requests, while serving

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
        self.lane = Lane()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.lane.run)
                if self.access is not None:
                    nursery.start_soon(self._flush_access)
                serving = await nursery.start(
                    partial(trio.serve_listeners, partial(_guarded, self._connection),
                            [_Admitting(listener, self._admit) for listener in listeners])
                )  # fmt: skip
                task_status.started(serving)
        finally:
            self.lane.close()
            if self.access is not None:
                self.access.flush()

    def _access_waiting(self) -> None:
        self._access_lines.set()

    async def _flush_access(self) -> None:
        assert self.access is not None
        while True:
            await self._access_lines.wait()
            await trio.sleep(ACCESS_FLUSH_SECONDS)
            self._access_lines = trio.Event()
            self.access.flush()

    def _admit(self, sock: trio.socket.SocketType | socket.socket, peer: tuple) -> bool:
        """Admission, in the accept loop: a refused connection costs no task, no stream,
        no system call but its own four (a flood reconnects as fast as it is refused).
        Whether ``sock`` gets a stream and a task."""
        client = _name(peer)
        decision = self.admission.admit(client[0], trio.current_time())
        if isinstance(decision, Refused):
            self.stats.rejected[decision.reason] += 1
            _refuse(sock)
            return False
        # The scope exists from now on: the connection may be displaced before its task runs.
        self._scopes[decision.conn] = scope = trio.CancelScope()
        if decision.evict is not None:
            assert decision.evicted_phase is not None
            self.stats.displaced[decision.evicted_phase] += 1
            self._scopes.pop(decision.evict).cancel()  # its own task closes its socket
            # One line per newcomer at most (a flood's refusals are only counted).
            log.info("displaced", client=decision.evicted_source, waiting_for=decision.evicted_phase,
                     reason=f"its slot went to {client[0]}, a source holding fewer")  # fmt: skip
        self._admitted[sock.fileno()] = (decision.conn, scope, client)
        self.stats.active_connections = len(self.admission)
        self.stats.connections += 1
        return True

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn, scope, client = self._admitted.pop(stream.socket.fileno())
        try:
            with scope:
                if hasattr(trio.socket, "TCP_NOTSENT_LOWAT"):
                    # trio sets 16 KiB so that a writer wakes only when the socket has nearly
                    # drained; a file sent with sendfile then stalls between refills (0.64x
                    # nginx for one client). 0 gives back the system's default, as nginx has.
                    with contextlib.suppress(OSError):
                        stream.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NOTSENT_LOWAT, 0)
                local = _name(stream.socket.getsockname())
                guard = None if self.fence is None else self.fence.guard_for(local[0])
                connection = Connection(
                    stream, self.router, self.limits, self.stats, client, local, self.access or False,
                    guard, partial(self._phase, conn), self.file_served, self.lane,
                )  # fmt: skip
                await connection.serve()
        finally:
            self._scopes.pop(conn, None)
            self.admission.release(conn)
            self.stats.active_connections = len(self.admission)

    def _phase(self, conn: int, phase: str) -> None:
        self.admission.mark(conn, phase, trio.current_time())


class _Admitting(trio.abc.Listener[trio.SocketStream]):
    """A listener whose ``accept`` returns only the connections ``admit`` keeps (trio's
    SocketListener.accept, with the peer's address it drops and no stream for a refusal).

    After each wait it takes what else is queued without waiting, up to ``ACCEPT_BATCH``
    (nginx's ``multi_accept``): trio's accept costs two passes through its scheduler, as
    much again as a refusal itself, and a flood arrives in bursts."""

    def __init__(self, inner: trio.SocketListener, admit) -> None:
        self.inner, self.admit = inner, admit
        self.admitted: deque[trio.socket.SocketType] = deque()
        # The same listening socket (a second descriptor) for accepts that never wait.
        self.raw = socket.socket(fileno=os.dup(inner.socket.fileno()))
        self.raw.setblocking(False)

    async def accept(self) -> trio.SocketStream:
        while not self.admitted:
            try:
                sock, peer = await self.inner.socket.accept()
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError from None
                if exc.errno in _IGNORABLE_ACCEPT_ERRNOS:
                    continue
                raise  # EMFILE and the like: serve_listeners waits and retries
            if self.admit(sock, peer):
                self.admitted.append(sock)
            self._take_queued()
        return trio.SocketStream(self.admitted.popleft())

    def _take_queued(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                raw, peer = self.raw.accept()
            except OSError as exc:  # EAGAIN: none left; anything else: the awaited accept says
                if exc.errno in _IGNORABLE_ACCEPT_ERRNOS:
                    continue
                return
            if self.admit(raw, peer):  # a trio socket only for what is kept
                self.admitted.append(trio.socket.from_stdlib_socket(raw))

    async def aclose(self) -> None:
        for sock in self.admitted:
            sock.close()
        self.admitted.clear()
        self.raw.close()
        await self.inner.aclose()


def _refuse(sock: trio.socket.SocketType | socket.socket) -> None:
    """The canned 503, and close, without waiting: a new socket's send buffer is empty.
    What the client sent already is read first: closing a socket with unread bytes
    resets the connection, and the client may lose the 503 it had not read yet."""
    fd = sock.fileno()
    for io in (lambda: os.write(fd, BUSY), lambda: os.read(fd, REFUSE_DRAIN)):
        with contextlib.suppress(OSError):
            io()
    sock.close()


async def _guarded(handler, stream: trio.SocketStream) -> None:
    """A connection's failure ends that connection, never the server."""
    try:
        await handler(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await stream.aclose()
    except Exception as exc:
        log.error("connection failed", error=f"{type(exc).__name__}: {exc}")
        await stream.aclose()
