"""What route handlers see and return (sans-IO): :class:`Request`, :class:`Response`, :class:`Route`.

A plugin adds routes with the ``httpboot_routes`` hook::

    from plugins.httpboot.messages import Response, Route

    def hello(request):
        return Response.json({"hello": request.params["name"]})

    Route("GET", "/api/v1/hello/{name}", hello)

Bodies are bytes, or an open file (:meth:`Response.file`) that the server
sends with ``sendfile`` and answers ``Range`` and conditional requests for.
Error pages are a status line's text and nothing else: never a server path.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, BinaryIO

from appliance.jsontext import dumps

JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"
NO_STORE = (b"cache-control", b"no-store")


@dataclass
class Request:
    method: str  # "GET", "HEAD", "POST", ...
    path: str  # percent-decoded, confined to what urlpath.split_target_untrusted lets through
    query: bytes
    headers: dict[bytes, bytes]  # lower-case names; repeated headers joined with ", "
    client: tuple[str, int]
    local: tuple[str, int]  # the address and port the request came to
    body: bytes = b""
    params: dict[str, str] = field(default_factory=dict)  # from the route's {placeholders}
    target: bytes = b""  # as sent, for the access log

    def header(self, name: bytes) -> bytes | None:
        return self.headers.get(name)


@dataclass
class FileRegion:
    """A region of an open file to send (the server closes ``handle`` afterwards)."""

    handle: BinaryIO
    offset: int
    count: int

    def __len__(self) -> int:  # h11 counts a body against Content-Length with len()
        return self.count


@dataclass
class Response:
    status: int = 200
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    region: FileRegion | None = None
    # A whole file (Response.file) before Range and conditional requests are applied.
    stat: os.stat_result | None = None
    # A kept file's whole-answer heads by Date (Response.kept): the same bytes each second.
    heads: dict[bytes, bytes] | None = None

    @classmethod
    def json(cls, document: Any, status: int = 200) -> Response:
        """Strict JSON (RFC 8259): a float that is not finite (a lease that never ends is
        ``inf`` in the node's status) is written ``null``, never ``Infinity`` or ``NaN``,
        which most parsers refuse."""
        text = dumps(document, separators=(",", ":"), sort_keys=True)
        return cls(status, [(b"content-type", JSON), NO_STORE], text.encode() + b"\n")

    @classmethod
    def text(cls, text: str, status: int = 200, content_type: bytes = TEXT) -> Response:
        return cls(status, [(b"content-type", content_type), NO_STORE], text.encode())

    @classmethod
    def error(cls, status: int, detail: str = "") -> Response:
        """A plain error page: the status and an optional detail about the request, never
        about the server (no path, no version)."""
        phrase = HTTPStatus(status).phrase
        text = f"{status} {phrase}\n" + (f"{detail}\n" if detail else "")
        return cls.text(text, status)

    @classmethod
    def unavailable(cls, detail: str = "") -> Response:
        """503 with ``Retry-After: 1``: not here, not now; the client's next try may
        reach the rack's active node."""
        busy = cls.error(503, detail)
        busy.headers.append((b"retry-after", b"1"))
        return busy

    @classmethod
    def file(
        cls, handle: BinaryIO, stat: os.stat_result, content_type: bytes | None = None
    ) -> Response:
        """A whole open regular file; the server applies Range and conditional requests."""
        headers = [(b"content-type", content_type)] if content_type else []
        return cls(200, headers, region=FileRegion(handle, 0, stat.st_size), stat=stat)

    @classmethod
    def kept(
        cls,
        content: bytes,
        stat: os.stat_result,
        headers: list[tuple[bytes, bytes]],
        heads: dict[bytes, bytes] | None = None,
    ) -> Response:
        """A whole file's bytes, kept in memory with its validators and content type in
        ``headers``; the server applies Range and conditional requests (hot.py). ``heads``:
        where the server keeps the head of the whole answer, made once a second."""
        return cls(200, headers, content, stat=stat, heads=heads)

    def close(self) -> None:
        if self.region is not None:
            self.region.handle.close()


Handler = Callable[[Request], "Response | Awaitable[Response]"]


@dataclass(frozen=True)
class Route:
    """``method`` and ``pattern`` (``/api/v1/things/{name}``; ``{name:path}`` spans
    slashes) to ``handler(request) -> Response`` (plain or ``async``).

    ``max_body``: the largest request body the handler accepts (bigger: 413
    before it runs). Handlers run in the node's trio thread: an async handler
    may await, a plain one must be quick.
    """

    method: str
    pattern: str
    handler: Handler
    max_body: int = 0
    name: str = ""  # for logs and metrics; default: the pattern
