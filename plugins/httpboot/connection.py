"""One HTTP/1.1 connection: h11 parses, this loop reads, routes and sends (trio shell).

Keep-alive until the client closes, says ``Connection: close``, or stays idle
for ``idle_timeout``. A request (head and body) must be in within
``request_timeout`` of the accept (a new connection) or of its first byte (a
kept-alive one): one deadline, not pushed back by each byte, so a head trickled
a byte at a time (slowloris) or never sent is cut all the same. A response is
not timed as a whole (a slow download is a client's right); only a client that
takes nothing for ``send_timeout`` is cut. Heads are capped by h11's ``max_incomplete_event_size``
(431), bodies by the route's ``max_body`` (413). A connection that cannot be
reused (an unread body, a protocol error) is answered with ``Connection: close``.

On a TCP socket the loop reads what has already arrived and writes what fits
with plain non-blocking system calls, and goes through trio (a wait, a
checkpoint) only when the socket is empty or full: a kept-alive client's next
request usually waits for nothing. After ``MAX_UNYIELDED`` requests in a row
answered without a wait the connection yields (a trio checkpoint), so a client
that pipelines cannot keep the other connections from their turn. A small file
(``SMALL_FILE`` bytes at most) leaves with its head in one write.

Between two requests (h11 holding nothing) the bytes go to the fast path first
(fastpath.py: the common request answered without h11), and a connection with
nothing to read waits in the server's lane (lane.py), which answers its common
requests without waking this task: the task deals with what they leave (an
unusual head, a body, a handler that awaits, the rest of a big answer). h11 is
``h11-mypyc``, the same parser compiled (about 3 times faster here); after a
head written without it (answering.py) the next request goes to a new h11 with
what the old one had read past the request.

The server learns what the connection waits for through ``on_phase`` (a head,
``HEAD``; the next request, ``IDLE``; or nothing, ``BUSY``, while a request is
answered): a full table may close a waiting one for a newcomer (admission.py),
never one that is answering.

A connection to the rack's VIP carries ``guard`` (``node.fence.ok``): each of
its requests is asked about before its handler runs and again before the answer
leaves (a handler may wait, e.g. for an event's durability); on a node that does
not hold the lease the request gets 503 and the connection is closed. A
connection to the node's own address has no guard.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any

import h11_mypyc as h11
import trio

from appliance.logs import LineBatch, Logger, get_logger

from .admission import BUSY, HEAD
from .answering import Limits, _Timeout
from .fastpath import MAX_UNYIELDED, FastPath, Parsed, checked, failed
from .files import fit_to_request
from .lane import Handover, Lane
from .messages import Request, Response, Route
from .router import Router
from .stats import Stats

__all__ = ["MAX_UNYIELDED", "Connection", "Limits", "access"]

log = get_logger("httpboot")
access = get_logger("httpboot.access")

RECEIVE_SIZE = 65536
LINGER_SECONDS = 2.0  # after an error with the request body unread: let the client see it
LINGER_BYTES = 256 << 10


def _head_size(event: h11.Request) -> int:
    return len(event.target) + sum(len(name) + len(value) + 4 for name, value in event.headers)


def _body_length(request: Request) -> int | None:
    """The declared body size (chunked: 1, read to see), 0 for none; ``None`` if unreadable."""
    if b"chunked" in (request.header(b"transfer-encoding") or b"").lower():
        return 1
    declared = request.header(b"content-length")
    if declared is None:
        return 0
    return int(declared) if declared.isdigit() and len(declared) < 19 else None


def _tokens(value: bytes) -> list[bytes]:
    return [token.strip().lower() for token in value.split(b",")]


class Connection(FastPath):
    def __init__(
        self,
        stream: trio.abc.Stream,
        router: Router,
        limits: Limits,
        stats: Stats,
        client: tuple[str, int],
        local: tuple[str, int],
        access_log: bool | LineBatch = True,
        guard: Callable[[], bool] | None = None,
        on_phase: Callable[[str], None] | None = None,
        file_served: Callable[[str, str], object] | None = None,
        lane: Lane | None = None,
    ) -> None:
        self.stream = stream
        self.router = router
        self.limits = limits
        self.stats = stats
        self.client, self.local = client, local
        # The server's batch of access lines (written together); True: a line at a time.
        self.access: Logger | LineBatch | None = (
            access if access_log is True else access_log or None
        )
        self.guard = guard  # fence.ok on a connection to the VIP; None: the node's own address
        self.on_phase = on_phase or (lambda phase: None)  # the server's admission table
        self.file_served = file_served  # the httpboot_file_served hook; None: nobody listens
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.h11_bypassed = False  # this request's head was written without h11
        self.answered = False  # a response just left and nothing more had come
        self.leftover = b""  # read past a request answered without h11: the next one's
        self.h11_saw = True  # h11 parsed the request being answered (not the fast parser)
        self.h11_raw = b""  # else its head, for h11 to read if it must write the answer
        self.keep_alive = False  # this request lets the connection stay open (HTTP/1.1, no close)
        # The socket's descriptor for reads and writes that need no wait (None: another
        # kind of stream, e.g. a test's memory stream, always goes through trio).
        self.fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None
        # Where the connection waits between requests, answered without its task (lane.py).
        self.lane = lane if self.fd is not None else None
        self.unyielded = 0
        self.reading = trio.CancelScope()  # serve() enters it
        self.phase = "request"  # a new connection owes its first request within request_timeout
        self.request_started = trio.current_time()
        self.deadline = self.request_started + limits.request_timeout

    async def serve(self) -> None:
        try:
            # The read deadline: one scope for the connection's life, armed only while a
            # read waits (a scope per wait cost ~8 % of a small file's CPU per request).
            with self.reading:
                await self._exchanges()
            if self.reading.cancelled_caught:
                raise _Timeout(self.phase)
        except _Timeout as timeout:
            self.stats.timeouts[timeout.phase] += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass  # the client went away
        finally:
            with trio.move_on_after(0.5) as cleanup:
                cleanup.shield = True
                await self.stream.aclose()

    async def _exchanges(self) -> None:
        while await self._one_exchange():
            self.unyielded += 1
            if self.unyielded >= MAX_UNYIELDED:
                self.unyielded = 0
                await trio.lowlevel.checkpoint()
            pipelined = self._next_cycle()
            self._idle(trio.current_time())
            if pipelined:  # a pipelined request is already here
                self._request_started()

    def _next_cycle(self) -> bool:
        """Ready h11 for the next request; whether some of it is here already. After a
        head written without h11 (``own_head``) h11 still waits to send one: a new h11
        takes what the old one had read past the request (a pipelined one)."""
        if self.h11.their_state is h11.IDLE:  # answered without h11: it saw nothing
            self.h11_bypassed, self.answered = False, not self.leftover
            return not self.answered
        if not self.h11_bypassed:
            self.h11.start_next_cycle()
            self.answered = not self.h11.trailing_data[0]
            return not self.answered
        self.h11_bypassed = False
        data, closed = self.h11.trailing_data
        self.h11 = h11.Connection(
            h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes
        )
        if data:
            self.h11.receive_data(data)
        if closed:
            self.h11.receive_data(b"")
        self.answered = not data and not closed
        return bool(data)

    def _request_started(self) -> None:
        self.phase = "request"
        self.request_started = trio.current_time()
        self.deadline = self.request_started + self.limits.request_timeout
        self.on_phase(HEAD)

    async def _fill(self) -> Parsed | None:
        """More bytes for h11. Between two requests (h11 holding nothing) the common ones
        are answered without h11 first (``_serve_fast``), and with nothing to read the
        connection waits in the lane, which answers them too; a request they parsed but
        leave to this task is returned (its head not given to h11)."""
        data: bytes | bytearray | None
        while True:
            if self.leftover:
                data, self.leftover = self.leftover, b""
            else:
                # Right after an answer the client has not had the time to send more: no
                # read that would say EAGAIN (a system call and an exception), the wait.
                data = None if self.answered else self._read_now()
            self.answered = False
            if self.lane is None or not self._between_requests():
                if data is None:
                    data = await self._wait_and_read()
                break
            if data == b"":
                break
            handover = await self._park() if data is None else self._serve_fast(data)
            if handover is None:  # all answered
                self.answered = True
                continue
            if handover.request is not None or handover.finish is not None:
                self.leftover = handover.data  # after this one, the fast path's again
                if handover.request is not None:
                    return handover.request  # type: ignore[no-any-return]
                await handover.finish()  # type: ignore[misc]
                continue
            data = handover.data
            if data or handover.eof:
                break
        if data and self.phase == "idle":
            self._request_started()
        self.h11.receive_data(bytes(data))
        return None

    def _between_requests(self) -> bool:
        return self.h11.their_state is h11.IDLE and not self.h11.trailing_data[0]

    async def _wait_and_read(self) -> bytes | bytearray:
        """Wait for bytes (bounded by the deadline), then read them."""
        data: bytes | bytearray | None = None
        while data is None:
            self.reading.deadline = self.deadline  # past it, the wait ends serve() (a timeout)
            try:
                if self.fd is None:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                else:  # the read just tried said EAGAIN: wait for the socket, not a 2nd try
                    await trio.lowlevel.wait_readable(self.fd)
            finally:
                self.reading.deadline = math.inf
            if self.reading.cancel_called:  # the deadline passed as the data came: too late
                raise _Timeout(self.phase)
            self.unyielded = 0
            if data is None:
                data = self._read_now()
        return data

    async def _park(self) -> Handover:
        """Wait in the lane until it hands the connection back; a deadline that passes
        counts only if no request was answered meanwhile (each answer moves it)."""
        assert self.lane is not None and self.fd is not None
        while True:
            with trio.CancelScope(deadline=self.deadline) as waiting:
                handover = await self.lane.park(self.fd, self._serve_fast)
            if not waiting.cancelled_caught:
                self.unyielded = 0
                return handover
            if trio.current_time() >= self.deadline:
                raise _Timeout(self.phase)

    def _read_now(self) -> bytes | None:
        """What the socket holds already, without a wait; None if it holds nothing."""
        if self.fd is None:
            return None
        try:
            data = os.read(self.fd, RECEIVE_SIZE)
        except BlockingIOError:
            return None
        if trio.current_time() >= self.deadline:  # as trio's cancelled wait would have it
            raise _Timeout(self.phase)
        return data

    async def _next_event(self) -> Any:
        """The next h11 event (``Request``, ``Data``, ``EndOfMessage``, ``ConnectionClosed``),
        or a request parsed without h11 that this task answers (``Parsed``)."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            parsed = await self._fill()
            if parsed is not None:
                return parsed

    # -- the common request, answered without h11 and without a wait ---------------

    # -- a request through h11 ----------------------------------------------------

    async def _one_exchange(self) -> bool:
        """Serve one request; whether the connection stays open for another."""
        try:
            event = await self._next_event()
        except h11.RemoteProtocolError as exc:
            self.stats.malformed += 1
            await self._send_error(exc.error_status_hint)
            return False
        if isinstance(event, h11.ConnectionClosed):
            return False
        if isinstance(event, Parsed):  # by the fast parser, its handler awaits
            self.h11_saw, self.h11_raw = False, event.raw
            return await self._answer(event.request, Response(), event.route, 0, event.pending)
        assert isinstance(event, h11.Request), event
        self.h11_saw = True
        self.on_phase(BUSY)  # its head is in: answered, not displaced, whatever it takes
        if _head_size(event) > self.limits.max_header_bytes:  # it came whole in one read
            self.stats.malformed += 1
            await self._send_error(431)
            return False
        method = event.method.decode("ascii", "replace")
        headers: dict[bytes, bytes] = {}
        for name, value in event.headers:
            headers[name] = headers[name] + b", " + value if name in headers else value
        # as h11 decides it (its _keep_alive): a 1.1 request without "close" in Connection
        connection = headers.get(b"connection")
        keep_alive = event.http_version == b"1.1" and (
            connection is None or b"close" not in _tokens(connection)
        )
        request, response, route = self._route(method, event.target, headers, keep_alive)
        return await self._answer(request, response, route, _body_length(request))

    async def _answer(
        self, request: Request, response: Response, route: Route | None, declared: int | None,
        pending: Awaitable[object] | None = None,
    ) -> bool:  # fmt: skip
        """Answer a routed request (its body, if any, still to read through h11); whether
        the connection stays open for another. ``pending``: what the route's plain handler
        returned for this request to wait for (the fast path called it), awaited instead
        of calling the handler again."""
        fenced = self._not_held()
        if fenced:
            if inspect.iscoroutine(pending):
                pending.close()  # never started: nothing it would have done is done
            response, route = Response.unavailable(), None
        elif declared is None:
            self.stats.malformed += 1
            response, route = Response.error(400), None
        elif route is not None:
            refused = await self._read_body(request, declared, route.max_body)
            response = refused or await self._call(route, request, pending)
        elif declared == 0 and self.h11_saw:
            await self._next_event()  # EndOfMessage: the connection stays usable
        whole_file = response.stat is not None
        if whole_file:
            response = fit_to_request(request, response)
        if not fenced and self._not_held():  # lost while the handler ran (it may wait)
            response.close()
            response, fenced = Response.unavailable(), True
        reusable = (not self.h11_saw or self.h11.their_state is h11.DONE) and not fenced
        announce = self._announcer(request, response, whole_file)
        try:
            sent = await self._send(request, response, close=not reusable, head_sent=announce)
        finally:
            response.close()
        self._sent(request, response.status, sent, None)
        if not reusable:
            await self._linger()
        return reusable and (self.h11_bypassed or self.h11.our_state is h11.DONE)

    def _not_held(self) -> bool:
        """A request to the rack's VIP while this node does not hold the lease (counted)."""
        if self.guard is None or self.guard():
            return False
        self.stats.fenced += 1
        return True

    async def _read_body(self, request: Request, declared: int, limit: int) -> Response | None:
        """Read the body into ``request.body``, or the error response refusing it."""
        if declared > limit:
            self.stats.malformed += 1
            return Response.error(413)
        if not self.h11_saw:  # parsed by the fast parser: no body
            return None
        if self.h11.they_are_waiting_for_100_continue:
            await self.stream.send_all(
                self.h11.send(h11.InformationalResponse(status_code=100, headers=[]))
            )
        body = bytearray()
        while True:
            try:
                part = await self._next_event()
            except h11.RemoteProtocolError:
                self.stats.malformed += 1
                return Response.error(400)
            if isinstance(part, h11.EndOfMessage):
                request.body = bytes(body)
                return None
            if isinstance(part, h11.ConnectionClosed):
                raise trio.BrokenResourceError
            body += part.data
            if len(body) > limit:
                self.stats.malformed += 1
                return Response.error(413)

    async def _call(
        self, route: Route, request: Request, pending: Awaitable[object] | None = None
    ) -> Response:
        try:
            response = route.handler(request) if pending is None else pending
            if inspect.isawaitable(response):
                response = await response
            return checked(response)
        except Exception as exc:
            return failed(route, exc)

    async def _send_error(self, status: int) -> None:
        """Answer a request h11 could not parse, if it is still possible to answer."""
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        request = Request("", "", b"", {}, self.client, self.local)
        try:
            sent = await self._send(request, Response.error(status), close=True)
        except h11.LocalProtocolError:
            return
        self._log(request, status, sent)
        await self._linger()

    async def _linger(self) -> None:
        """Stop sending, then read and drop what the client still sends for a moment, so
        the close does not reset the connection before the client has read our answer."""
        try:
            await self.stream.send_eof()  # type: ignore[attr-defined]
        except (AttributeError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        drained = 0
        with trio.move_on_after(LINGER_SECONDS):
            while drained < LINGER_BYTES:
                data = await self.stream.receive_some(RECEIVE_SIZE)
                if not data:
                    break
                drained += len(data)
