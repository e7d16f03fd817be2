"""A response out (trio shell): its head, its body, and what follows it.

The head is a kept file's, made once a second (``Response.kept``); or written
here (``own_head``: the bytes h11 writes, without its ~20 µs of checks and
framing) for a kept-alive HTTP/1.1 exchange when the handler's headers need
nothing of h11 (no framing header of its own, names that are tokens, values
without control characters); or h11's, for anything else (HTTP/1.0,
``Connection: close``, an error closing the connection). A small file (``SMALL_FILE``
bytes at most) leaves with its head in one write, a bigger one by ``sendfile``.
Then the ``httpboot_file_served`` hook (a file's GET answered 200 or 206), the
counters and the access line, which goes to the server's
:class:`appliance.logs.LineBatch`: formatted at once, written together within
``ACCESS_FLUSH_SECONDS`` (server.py).

:class:`Answering` is a part of :class:`~plugins.httpboot.connection.Connection`:
the attributes it declares are the connection's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import h11_mypyc as h11
import trio

from appliance.logs import LineBatch, Logger, get_logger

from .conditional import http_date
from .messages import FileRegion, Request, Response
from .responsehead import REASONS, own_head, plain_headers
from .script import BOOT_PREFIX
from .sendfile import FileChanged, SendTimeout, send_head_and_file
from .stats import Stats

log = get_logger("httpboot")

SERVER = b"rackboot"
MAX_LOGGED_TARGET = 256
SMALL_FILE = 64 << 10  # read into memory and written with the head in one call


@dataclass(frozen=True)
class Limits:
    request_timeout: float = 10.0
    idle_timeout: float = 60.0
    send_timeout: float = 30.0
    max_header_bytes: int = 16 << 10


class _Timeout(Exception):
    def __init__(self, phase: str) -> None:
        self.phase = phase


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


def _bodyless(request: Request, response: Response) -> bool:
    return request.method == "HEAD" or response.status == 304 or response.status < 200


class Answering:
    stream: trio.abc.Stream
    fd: int | None
    h11: h11.Connection
    stats: Stats
    client: tuple[str, int]
    access: Logger | LineBatch | None
    file_served: Callable[[str, str], object] | None
    limits: Limits
    keep_alive: bool  # the request lets the connection stay open (HTTP/1.1, no close)
    h11_bypassed: bool  # this request's head was written without h11
    h11_saw: bool  # h11 parsed the request being answered (not the fast parser)
    h11_raw: bytes  # else its head, for h11 to read if it must write the answer
    request_started: float

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
            if isinstance(body, bytes) and response.region is None:
                body = self.h11.send(h11.Data(data=body)) if body else b""
                body += self.h11.send(h11.EndOfMessage())
            else:  # h11 counts a region against Content-Length by len(), passes it
                if len(body):
                    self.h11.send_with_data_passthrough(h11.Data(data=response.region))  # type: ignore[arg-type]
                self.h11.send(h11.EndOfMessage())
        if isinstance(body, FileRegion):
            await self._send_file(request, head, body, head_sent)
        else:
            await self._send_bytes(head + body if body else head)
            if head_sent is not None:
                head_sent()
        return 0 if _bodyless(request, response) else length

    def _head(
        self, request: Request, response: Response, close: bool, own: bool | None = None
    ) -> tuple[bytes, int]:
        """The head of ``response`` and its body's length. ``own``: written here (see
        responsehead.py), decided here when None, else through h11."""
        length = len(response.region) if response.region is not None else len(response.body)
        kept = None if close or not self.keep_alive else self._kept_head(response)
        if kept is not None:
            self.h11_bypassed = True
            return kept, length
        date = _date.now()
        headers = [(b"server", SERVER), (b"date", date), *response.headers]
        if response.status != 304:
            headers.append((b"content-length", b"%d" % length))
        if close:
            headers.append((b"connection", b"close"))
        if own is None:
            own = (not close and self.keep_alive and response.status >= 200
                   and plain_headers(response.headers))  # fmt: skip
        if own:  # the common case: no framing for h11 to decide, and it costs ~20 µs
            self.h11_bypassed = True
            head = own_head(response.status, headers)
            if response.heads is not None and response.status == 200 and not close:
                response.heads.clear()  # another second's
                response.heads[date] = head
            return head, length
        if not self.h11_saw:  # parsed without h11: h11 reads the same head, then writes
            self.h11.receive_data(self.h11_raw)
            self.h11.next_event(), self.h11.next_event()  # the request, its end
            self.h11_saw = True
        head = self.h11.send(
            h11.Response(status_code=response.status, headers=headers,
                         reason=REASONS.get(response.status, b""))
        )  # fmt: skip
        return head, length

    @staticmethod
    def _kept_head(response: Response) -> bytes | None:
        """The head a kept file's whole answer had this second already (the same bytes)."""
        if response.heads is None or response.status != 200:
            return None
        return response.heads.get(_date.now())

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

    def _read_small(self, request: Request, region: FileRegion) -> bytes:
        """A small region's bytes (from the page cache: boot files are read over and over)."""
        data = os.pread(region.handle.fileno(), region.count, region.offset)
        if len(data) < region.count:
            log.error("file shrank while it was sent", path=request.path)
            raise trio.BrokenResourceError
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

    def _sent(
        self, request: Request, status: int, sent: int, announce: Callable[[], None] | None
    ) -> None:
        """An answer has left: the hook, the counters, the access line."""
        if announce is not None:
            announce()
        self.stats.bytes_sent += sent
        self._log(request, status, sent)

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
