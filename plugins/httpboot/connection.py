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

h11 is ``h11-mypyc``, the same parser compiled (about 3 times faster here). It
parses every request. The head of a response to a kept-alive HTTP/1.1 request is
written here (``_own_head``: the bytes h11 writes, without its ~20 µs of checks
and framing) when the handler's headers need nothing of h11 (no framing header
of its own, names that are tokens, values without control characters); the next
request then goes to a new h11 with what the old one had read past the request.
Anything else (HTTP/1.0, ``Connection: close``, an error closing the
connection) goes through h11 as before.

Access lines go to the server's :class:`appliance.logs.LineBatch`: formatted at
once, written together within ``ACCESS_FLUSH_SECONDS`` (server.py).

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

import functools
import inspect
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import h11_mypyc as h11
import trio

from appliance.logs import LineBatch, Logger, get_logger

from .admission import BUSY, HEAD, IDLE
from .conditional import http_date
from .files import fit_to_request
from .head import SimpleHead, parse_head_untrusted
from .lane import Handover, Lane
from .messages import FileRegion, Request, Response, Route
from .responsehead import REASONS, own_head, plain_headers
from .router import Router
from .script import BOOT_PREFIX
from .sendfile import FileChanged, SendTimeout, send_head_and_file
from .stats import Stats
from .urlpath import BadTarget, SplitTargets

log = get_logger("httpboot")
access = get_logger("httpboot.access")

RECEIVE_SIZE = 65536
SERVER = b"rackboot"
MAX_LOGGED_TARGET = 256
LINGER_SECONDS = 2.0  # after an error with the request body unread: let the client see it
LINGER_BYTES = 256 << 10
MAX_UNYIELDED = 16  # requests answered without a wait before the others' turn is forced
SMALL_FILE = 64 << 10  # read into memory and written with the head in one call
_split_target = SplitTargets()  # split_target_untrusted, remembered for recent targets
_GIVEN_UP = Handover()  # _answer_fast: this request is the task's to answer, through h11


@dataclass(frozen=True)
class Limits:
    request_timeout: float = 10.0
    idle_timeout: float = 60.0
    send_timeout: float = 30.0
    max_header_bytes: int = 16 << 10


class _Timeout(Exception):
    def __init__(self, phase: str) -> None:
        self.phase = phase


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


def _bodyless(request: Request, response: Response) -> bool:
    return request.method == "HEAD" or response.status == 304 or response.status < 200


def _tokens(value: bytes) -> list[bytes]:
    return [token.strip().lower() for token in value.split(b",")]


class _Date:
    """The Date header, formatted once a second at most."""

    def __init__(self) -> None:
        self._second, self._value = -1, b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second, self._value = second, http_date(second)
        return self._value


_date = _Date()


def _checked(response: object) -> Response:
    if not isinstance(response, Response):
        raise TypeError(f"handler returned {type(response).__name__}, not a Response")
    return response


def _failed(route: Route, exc: Exception) -> Response:
    log.error("route handler failed", route=route.name or route.pattern,
              error=f"{type(exc).__name__}: {exc}")  # fmt: skip
    return Response.error(500)


@functools.lru_cache(maxsize=256)
def _awaits(handler: Callable[..., Any]) -> bool:
    """An ``async def`` handler: the lane cannot wait for it, the connection's task does."""
    return inspect.iscoroutinefunction(handler)


class Connection:
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

    def _idle(self, now: float) -> None:
        self.phase = "idle"
        self.deadline = now + self.limits.idle_timeout
        self.on_phase(IDLE)

    def _next_cycle(self) -> bool:
        """Ready h11 for the next request; whether some of it is here already. After a
        head written without h11 (``own_head``) h11 still waits to send one: a new h11
        takes what the old one had read past the request (a pipelined one)."""
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

    async def _fill(self) -> None:
        """More bytes for h11. Between two requests (h11 holding nothing) the common ones
        are answered without h11 first (``_serve_fast``), and with nothing to read the
        connection waits in the lane, which answers them too."""
        while True:
            # Right after an answer the client has not had the time to send more: no read
            # that would say EAGAIN (a system call and an exception), the wait at once.
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
            if handover.finish is not None:
                await handover.finish()
            if handover.data or handover.eof:
                data = handover.data
                break
        if data and self.phase == "idle":
            self._request_started()
        self.h11.receive_data(bytes(data))

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

    async def _send_bytes(self, data: bytes) -> None:
        """Write ``data``: what fits at once without a wait, the rest through trio within
        ``send_timeout``."""
        sent = 0
        if self.fd is not None:
            try:
                sent = os.write(self.fd, data)
            except BlockingIOError:
                sent = 0
        if sent < len(data):
            with trio.move_on_after(self.limits.send_timeout) as scope:
                await self.stream.send_all(memoryview(data)[sent:] if sent else data)
            if scope.cancelled_caught:
                raise _Timeout("send")

    async def _next_event(self) -> Any:
        """The next h11 event (``Request``, ``Data``, ``EndOfMessage``, ``ConnectionClosed``)."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            await self._fill()

    # -- the common request, answered without h11 and without a wait ---------------

    def _serve_fast(self, data: bytes) -> Handover | None:
        """Answer the requests at the start of ``data`` that need neither h11 nor a wait
        (at most ``MAX_UNYIELDED``); what is left is the task's (None: nothing)."""
        start, now = 0, trio.current_time()
        for _ in range(MAX_UNYIELDED):
            head = parse_head_untrusted(data, start, self.limits.max_header_bytes)
            if head is None:
                break
            self.request_started = now
            finish = self._answer_fast(head)
            if finish is _GIVEN_UP:
                break
            start = head.end
            if finish is not None:
                self.on_phase(BUSY)  # answering: not to be displaced
                return Handover(data[start:], finish=finish.finish)
            self._idle(now)
            if start == len(data):
                return None
        return Handover(data[start:])

    def _answer_fast(self, head: SimpleHead) -> Handover | None:
        """Answer one parsed request now; None once answered, a handover holding the rest
        of the answer (a big file, a full socket), or ``_GIVEN_UP`` (nothing done: h11's)."""
        if self.guard is not None and not self.guard():
            return _GIVEN_UP  # the task answers 503 and closes
        request, response, route = self._route(head.method, head.target, head.headers, True)
        if route is not None:
            if _awaits(route.handler):
                return _GIVEN_UP
            response = self._call_now(route, request)
            if response is None:
                return _GIVEN_UP
        whole_file = response.stat is not None
        if whole_file:
            response = fit_to_request(request, response)
        if not plain_headers(response.headers) or (
            route is not None and self.guard is not None and not self.guard()
        ):
            response.close()  # h11 must frame it, or the lease went: the task does it again
            return _GIVEN_UP
        announce = self._announcer(request, response, whole_file)
        head_bytes, length = self._head(request, response, close=False, own=True)
        body = self._body(request, response)
        length = 0 if _bodyless(request, response) else length
        if isinstance(body, FileRegion):  # a big file: sendfile, by the task
            return Handover(finish=partial(self._finish_file, request, response, head_bytes,
                                           announce, length))  # fmt: skip
        data = head_bytes + body if body else head_bytes
        try:
            sent = os.write(self.fd, data)  # type: ignore[arg-type]
        except BlockingIOError:
            sent = 0
        response.close()
        if sent < len(data):
            return Handover(finish=partial(self._finish_bytes, request, response.status,
                                           data[sent:], announce, length))  # fmt: skip
        self._sent(request, response.status, length, announce)
        return None

    def _call_now(self, route: Route, request: Request) -> Response | None:
        """A plain handler's response; None if it returned something to wait for."""
        try:
            response = route.handler(request)
            if inspect.isawaitable(response):
                if inspect.iscoroutine(response):
                    response.close()
                return None
            return _checked(response)
        except Exception as exc:
            return _failed(route, exc)

    async def _finish_bytes(
        self, request: Request, status: int, rest: bytes, announce: Callable[[], None] | None,
        length: int,
    ) -> None:  # fmt: skip
        await self._send_bytes(rest)
        self._sent(request, status, length, announce)

    async def _finish_file(
        self, request: Request, response: Response, head: bytes,
        announce: Callable[[], None] | None, length: int,
    ) -> None:  # fmt: skip
        try:
            assert response.region is not None
            await self._send_file(request, head, response.region, announce)
        finally:
            response.close()
        self._sent(request, response.status, length, None)

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
        assert isinstance(event, h11.Request), event
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
        declared = _body_length(request)
        fenced = self._not_held()
        if fenced:
            response, route = Response.unavailable(), None
        elif declared is None:
            self.stats.malformed += 1
            response, route = Response.error(400), None
        elif route is not None:
            refused = await self._read_body(request, declared, route.max_body)
            response = refused or await self._call(route, request)
        elif declared == 0:
            await self._next_event()  # EndOfMessage: the connection stays usable
        whole_file = response.stat is not None
        if whole_file:
            response = fit_to_request(request, response)
        if not fenced and self._not_held():  # lost while the handler ran (it may wait)
            response.close()
            response, fenced = Response.unavailable(), True
        reusable = self.h11.their_state is h11.DONE and not fenced
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

    def _route(
        self, method: str, target: bytes, headers: dict[bytes, bytes], keep_alive: bool
    ) -> tuple[Request, Response, Route | None]:
        self.keep_alive = keep_alive
        request = Request(method, "", b"", headers, self.client, self.local, target=target)
        try:
            request.path, request.query = _split_target(target)
        except BadTarget as exc:
            self.stats.malformed += 1
            return request, Response.error(exc.status), None
        match = self.router.match(method, request.path)
        if match.route is None:
            if not match.allowed:
                return request, Response.error(404), None
            refused = Response.error(405)
            refused.headers.append((b"allow", ", ".join(match.allowed).encode()))
            return request, refused, None
        request.params = match.params
        return request, Response(), match.route

    async def _read_body(self, request: Request, declared: int, limit: int) -> Response | None:
        """Read the body into ``request.body``, or the error response refusing it."""
        if declared > limit:
            self.stats.malformed += 1
            return Response.error(413)
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

    async def _call(self, route: Route, request: Request) -> Response:
        try:
            response = route.handler(request)
            if inspect.isawaitable(response):
                response = await response
            return _checked(response)
        except Exception as exc:
            return _failed(route, exc)

    def _announcer(
        self, request: Request, response: Response, whole_file: bool
    ) -> Callable[[], None] | None:
        """The httpboot_file_served call for a file's GET answered 200 or 206, else None."""
        if (whole_file and self.file_served is not None and request.method == "GET"
                and response.status in (200, 206)):  # fmt: skip
            return partial(self._file_served, request)
        return None

    def _file_served(self, request: Request) -> None:
        """The httpboot_file_served hook, once a file's head has left: the name as the
        request gave it (below /boot/, else its path), never a reason to fail the answer."""
        assert self.file_served is not None
        path = request.path
        path = path[len(BOOT_PREFIX) :] if path.startswith(BOOT_PREFIX) else path.lstrip("/")
        try:
            self.file_served(path, self.client[0])
        except Exception as exc:
            log.error("file served hook failed", error=f"{type(exc).__name__}: {exc}")

    def _head(
        self, request: Request, response: Response, close: bool, own: bool | None = None
    ) -> tuple[bytes, int]:
        """The head of ``response`` and its body's length. ``own``: written here (see
        responsehead.py), decided here when None, else through h11."""
        length = len(response.region) if response.region is not None else len(response.body)
        headers = [(b"server", SERVER), (b"date", _date.now()), *response.headers]
        if response.status != 304:
            headers.append((b"content-length", b"%d" % length))
        if close:
            headers.append((b"connection", b"close"))
        if own is None:
            own = (not close and self.keep_alive and response.status >= 200
                   and plain_headers(response.headers))  # fmt: skip
        if own:  # the common case: no framing for h11 to decide, and it costs ~20 µs
            self.h11_bypassed = True
            return own_head(response.status, headers), length
        head = self.h11.send(
            h11.Response(status_code=response.status, headers=headers,
                         reason=REASONS.get(response.status, b""))
        )  # fmt: skip
        return head, length

    def _body(self, request: Request, response: Response) -> bytes | FileRegion:
        """The bytes to write after the head, or a region too big for them (sendfile)."""
        if _bodyless(request, response):
            return b""
        region = response.region
        if region is None:
            return response.body
        if self.fd is not None and len(region) <= SMALL_FILE or not region.count:
            return self._read_small(request, region)
        return region

    async def _send(
        self,
        request: Request,
        response: Response,
        close: bool,
        head_sent: Callable[[], None] | None = None,
    ) -> int:
        """Send ``response``; the body bytes sent. ``head_sent`` is called once the head
        has left (with the body, for all but a big file)."""
        head, length = self._head(request, response, close)
        body = self._body(request, response)
        if not self.h11_bypassed:  # h11 wrote the head: it frames and ends the body too
            if response.region is None:
                body = self.h11.send(h11.Data(data=body)) if body else b""
            elif len(body):  # h11 counts a region against Content-Length by len(), passes it
                self.h11.send_with_data_passthrough(h11.Data(data=response.region))  # type: ignore[arg-type]
            end = self.h11.send(h11.EndOfMessage())
            if response.region is None:
                body += end
        if isinstance(body, FileRegion):
            await self._send_file(request, head, body, head_sent)
        else:
            await self._send_bytes(head + body if body else head)
            if head_sent is not None:
                head_sent()
        return 0 if _bodyless(request, response) else length

    def _sent(
        self, request: Request, status: int, sent: int, announce: Callable[[], None] | None
    ) -> None:
        """An answer has left: the hook, the counters, the access line."""
        if announce is not None:
            announce()
        self.stats.bytes_sent += sent
        self._log(request, status, sent)

    def _read_small(self, request: Request, region: FileRegion) -> bytes:
        """A small region's bytes (from the page cache: boot files are read over and over)."""
        data = os.pread(region.handle.fileno(), region.count, region.offset)
        if len(data) < region.count:
            log.error("file shrank while it was sent", path=request.path)
            raise trio.BrokenResourceError
        return data

    async def _send_file(
        self,
        request: Request,
        head: bytes,
        region: FileRegion,
        head_sent: Callable[[], None] | None,
    ) -> None:
        try:
            await send_head_and_file(self.stream, head, region, self.limits.send_timeout, head_sent)
        except SendTimeout:
            raise _Timeout("send") from None
        except FileChanged:
            log.error("file shrank while it was sent", path=request.path)
            raise trio.BrokenResourceError from None

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

    def _log(self, request: Request, status: int, sent: int) -> None:
        self.stats.count_request(request.method, status)
        if self.access is not None:
            self.access.info(
                "request",
                client=self.client[0],
                method=request.method or "-",
                target=request.target[:MAX_LOGGED_TARGET].decode("ascii", "replace") or "-",
                status=status,
                bytes=sent,
                ms=round((trio.current_time() - self.request_started) * 1000, 1),
            )
