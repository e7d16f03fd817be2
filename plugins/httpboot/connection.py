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

import inspect
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any

import h11_mypyc as h11
import trio

from appliance.logs import LineBatch, Logger, get_logger

from .admission import BUSY, HEAD, IDLE
from .conditional import http_date
from .files import fit_to_request
from .messages import FileRegion, Request, Response, Route
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
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


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


def _tokens(value: bytes) -> list[bytes]:
    return [token.strip().lower() for token in value.split(b",")]


# What h11 would accept in a header it writes (RFC 9110 5.1, 5.5): a token, and a value
# without control characters but tab. A handler's header outside them goes through h11.
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*")
_FRAMING = (b"content-length", b"transfer-encoding", b"connection")


def _plain_headers(headers: list[tuple[bytes, bytes]]) -> bool:
    """A handler's headers that can be written as they are (no framing of its own)."""
    for name, value in headers:
        if (name in _FRAMING or _FIELD_NAME.fullmatch(name) is None
                or _FIELD_VALUE.fullmatch(value) is None):  # fmt: skip
            return False
    return True


def _own_head(status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A response head as h11 writes it for a kept-alive HTTP/1.1 exchange whose length
    is in ``headers`` (or that has no body: HEAD, 304)."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
    lines += [b"%s: %s\r\n" % header for header in headers]
    lines.append(b"\r\n")
    return b"".join(lines)


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
            self.phase = "idle"
            self.deadline = trio.current_time() + self.limits.idle_timeout
            self.on_phase(IDLE)
            if pipelined:  # a pipelined request is already here
                self._request_started()

    def _next_cycle(self) -> bool:
        """Ready h11 for the next request; whether some of it is here already. After a
        head written without h11 (``_own_head``) h11 still waits to send one: a new h11
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
        # Right after an answer the client has not had the time to send more: no read
        # that would say EAGAIN (a system call and an exception), the wait at once.
        data: bytes | bytearray | None = None if self.answered else self._read_now()
        self.answered = False
        while data is None:  # nothing yet: wait (bounded by the deadline)
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
        if data and self.phase == "idle":
            self._request_started()
        self.h11.receive_data(bytes(data))

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
        request, response, route = self._route(event)
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
        announce = None
        if (whole_file and self.file_served is not None and request.method == "GET"
                and response.status in (200, 206)):  # fmt: skip
            announce = partial(self._file_served, request)
        try:
            sent = await self._send(request, response, close=not reusable, head_sent=announce)
        finally:
            response.close()
        self._log(request, response.status, sent)
        if not reusable:
            await self._linger()
        return reusable and (self.h11_bypassed or self.h11.our_state is h11.DONE)

    def _not_held(self) -> bool:
        """A request to the rack's VIP while this node does not hold the lease (counted)."""
        if self.guard is None or self.guard():
            return False
        self.stats.fenced += 1
        return True

    def _route(self, event: h11.Request) -> tuple[Request, Response, Route | None]:
        method = event.method.decode("ascii", "replace")
        headers: dict[bytes, bytes] = {}
        for name, value in event.headers:
            headers[name] = headers[name] + b", " + value if name in headers else value
        # as h11 decides it (its _keep_alive): a 1.1 request without "close" in Connection
        connection = headers.get(b"connection")
        self.keep_alive = event.http_version == b"1.1" and (
            connection is None or b"close" not in _tokens(connection)
        )
        request = Request(method, "", b"", headers, self.client, self.local, target=event.target)
        try:
            request.path, request.query = _split_target(event.target)
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
            if not isinstance(response, Response):
                raise TypeError(f"handler returned {type(response).__name__}, not a Response")
            return response
        except Exception as exc:
            log.error(
                "route handler failed",
                route=route.name or route.pattern,
                error=f"{type(exc).__name__}: {exc}",
            )
            return Response.error(500)

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

    async def _send(
        self,
        request: Request,
        response: Response,
        close: bool,
        head_sent: Callable[[], None] | None = None,
    ) -> int:
        """Send ``response``; the body bytes sent. ``head_sent`` is called once the head
        has left (with the body, for all but a big file)."""
        bodyless = request.method == "HEAD" or response.status == 304 or response.status < 200
        length = len(response.region) if response.region is not None else len(response.body)
        headers = [(b"server", SERVER), (b"date", _date.now()), *response.headers]
        if response.status != 304:
            headers.append((b"content-length", b"%d" % length))
        if close:
            headers.append((b"connection", b"close"))
        own = (not close and self.keep_alive and response.status >= 200
               and _plain_headers(response.headers))  # fmt: skip
        if own:  # the common case: no framing for h11 to decide, and it costs ~20 µs
            head = _own_head(response.status, headers)
            self.h11_bypassed = True
        else:
            head = self.h11.send(
                h11.Response(status_code=response.status, headers=headers,
                             reason=_REASONS.get(response.status, b""))
            )  # fmt: skip
        if response.region is not None and not bodyless and length:
            if not own:  # h11 counts the region against Content-Length by len(), passes it
                self.h11.send_with_data_passthrough(h11.Data(data=response.region))  # type: ignore[arg-type]
                self.h11.send(h11.EndOfMessage())
            if self.fd is not None and length <= SMALL_FILE:
                await self._send_bytes(head + self._read_small(request, response.region))
                if head_sent is not None:
                    head_sent()
            else:
                await self._send_file(request, head, response.region, head_sent)
        elif own:
            await self._send_bytes(head + response.body if response.body and not bodyless else head)
            if head_sent is not None:
                head_sent()
        else:
            data = head
            if response.body and not bodyless:
                data += self.h11.send(h11.Data(data=response.body))
            data += self.h11.send(h11.EndOfMessage())
            await self._send_bytes(data)
            if head_sent is not None:
                head_sent()
        sent = 0 if bodyless else length
        self.stats.bytes_sent += sent
        return sent

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
