"""The common request answered without h11 and without a wait (trio shell).

Between two requests a connection's bytes go here first, from the lane (a
parked connection) or from its own read: ``_serve_fast`` answers the requests
at their start that the fast parser takes (head.py) and a plain handler
answers, through the same routing, ``fit_to_request``, head, write, hook,
counters and access line as a request through h11, and hands back (lane.py's
:class:`~plugins.httpboot.lane.Handover`) what it leaves: the bytes from the
first request it does not take (for h11), a request whose handler awaits (for
the task, without h11), the rest of an answer the socket did not take at once,
or a big file to send. At most ``MAX_UNYIELDED`` requests at a time.

:class:`FastPath` is a part of :class:`~plugins.httpboot.connection.Connection`.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import trio

from appliance.logs import get_logger

from .admission import BUSY, IDLE
from .answering import Answering, _bodyless
from .files import fit_to_request
from .head import SimpleHead, parse_head_untrusted
from .lane import Handover
from .messages import FileRegion, Request, Response, Route
from .responsehead import plain_headers
from .router import Router
from .urlpath import BadTarget, SplitTargets

log = get_logger("httpboot")

MAX_UNYIELDED = 16  # requests answered without a wait before the others' turn is forced
_split_target = SplitTargets()  # split_target_untrusted, remembered for recent targets
_GIVEN_UP = Handover()  # _answer_fast: this request is the task's to answer, through h11


@dataclass(frozen=True)
class Parsed:
    """A request the fast path parsed and routed, for the task to answer without h11 (its
    handler awaits, or a plain one returned ``pending``, an awaitable: the task awaits it
    instead of calling the handler again); ``raw``, its head, for h11 if the answer needs
    h11 to write it."""

    request: Request
    route: Route
    raw: bytes
    pending: Awaitable[object] | None = None  # what a plain handler returned to wait for


def checked(response: object) -> Response:
    if not isinstance(response, Response):
        raise TypeError(f"handler returned {type(response).__name__}, not a Response")
    return response


def failed(route: Route, exc: Exception) -> Response:
    log.error("route handler failed", route=route.name or route.pattern,
              error=f"{type(exc).__name__}: {exc}")  # fmt: skip
    return Response.error(500)


class FastPath(Answering):
    router: Router
    guard: Callable[[], bool] | None
    on_phase: Callable[[str], None]
    local: tuple[str, int]

    phase: str  # "request" (a head is owed), "idle" (between requests)
    deadline: float

    def _idle(self, now: float) -> None:
        self.phase = "idle"
        self.deadline = now + self.limits.idle_timeout
        self.on_phase(IDLE)

    def _serve_fast(self, data: bytes) -> Handover | None:
        """Answer the requests at the start of ``data`` that need neither h11 nor a wait
        (at most ``MAX_UNYIELDED``); what is left is the task's (None: nothing)."""
        start, now = 0, trio.current_time()
        for _ in range(MAX_UNYIELDED):
            head = parse_head_untrusted(data, start, self.limits.max_header_bytes)
            if head is None:
                break
            self.request_started = now
            finish = self._answer_fast(head, data, start)
            if finish is _GIVEN_UP:
                break
            if isinstance(finish, Parsed):  # its handler awaits: the task's to answer
                self.on_phase(BUSY)
                return Handover(data[head.end :], request=finish)
            start = head.end
            if finish is not None:
                self.on_phase(BUSY)  # answering: not to be displaced
                return Handover(data[start:], finish=finish.finish)
            self._idle(now)
            if start == len(data):
                return None
        return Handover(data[start:])

    def _answer_fast(self, head: SimpleHead, data: bytes, start: int) -> Handover | Parsed | None:
        """Answer the request ``head`` parsed from ``data[start:]`` now: None once answered,
        a handover holding the rest of the answer (a big file, a full socket), the parsed
        request if its handler awaits, or ``_GIVEN_UP`` (nothing done: h11's)."""
        if self.guard is not None and not self.guard():
            return _GIVEN_UP  # the task answers 503 and closes
        request, response, route = self._route(head.method, head.target, head.headers, True)
        if route is not None:
            if inspect.iscoroutinefunction(route.handler):  # the task waits for it
                return Parsed(request, route, data[start : head.end])
            answer = self._call_now(route, request)
            if not isinstance(answer, Response):  # it must wait: the task awaits it
                return Parsed(request, route, data[start : head.end], answer)
            response = answer
        whole_file = response.stat is not None
        if whole_file:
            response = fit_to_request(request, response)
        head_bytes = self._kept_head(response)
        if (head_bytes is None and not plain_headers(response.headers)) or (
            route is not None and self.guard is not None and not self.guard()
        ):
            response.close()  # h11 must frame it, or the lease went: the task does it again
            return _GIVEN_UP
        announce = self._announcer(request, response, whole_file)
        if head_bytes is None:
            head_bytes, length = self._head(request, response, close=False, own=True)
        else:
            self.h11_bypassed, length = True, len(response.body)
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

    def _call_now(self, route: Route, request: Request) -> Response | Awaitable[object]:
        """A plain handler's response, or the awaitable it returned (a wait it needs: the
        connection's task awaits it)."""
        try:
            response = route.handler(request)
            if inspect.isawaitable(response):
                return response
            return checked(response)
        except Exception as exc:
            return failed(route, exc)

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
