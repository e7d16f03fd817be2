"""A whole file's response, fitted to the request: 304, 206, 416 or 200 (sans-IO).

Content types come from a short fixed table (no dependence on the host's
``mime.types``): UEFI HTTP boot checks for ``application/efi``.
"""

from __future__ import annotations

import posixpath

from .conditional import Validators, not_modified, range_applies
from .messages import Request, Response
from .ranges import ByteRange, Unsatisfiable, parse_range_untrusted

CONTENT_TYPES = {
    ".efi": b"application/efi",
    ".ipxe": b"text/plain; charset=utf-8",
    ".cfg": b"text/plain; charset=utf-8",
    ".txt": b"text/plain; charset=utf-8",
    ".json": b"application/json",
    ".iso": b"application/vnd.efi-iso",
    ".img": b"application/vnd.efi-img",
    ".html": b"text/html; charset=utf-8",
}
OCTETS = b"application/octet-stream"


def content_type(path: str) -> bytes:
    return CONTENT_TYPES.get(posixpath.splitext(path)[1].lower(), OCTETS)


_ASKS = (b"range", b"if-none-match", b"if-modified-since")


def fit_to_request(request: Request, response: Response) -> Response:
    """Apply validators, conditional requests and ``Range`` to a whole-file response: an
    open file (:meth:`Response.file`), or a file's bytes in memory made with its headers
    (:meth:`Response.kept`, hot.py)."""
    st, body = response.stat, response.region
    if st is None or response.status != 200:
        return response
    if body is None and not any(name in request.headers for name in _ASKS):
        return response  # in memory, its headers made once, nothing asked of them
    validators = Validators.of_file(st.st_size, st.st_mtime_ns, st.st_ino)
    if body is None:
        headers = response.headers
    else:
        headers = [
            (b"etag", validators.etag),
            (b"last-modified", validators.last_modified),
            (b"accept-ranges", b"bytes"),
        ]
        if not any(name == b"content-type" for name, _ in response.headers):
            headers.append((b"content-type", content_type(request.path)))
        headers += response.headers
    if request.method in ("GET", "HEAD") and not_modified(
        validators, request.header(b"if-none-match"), request.header(b"if-modified-since")
    ):
        response.close()
        kept = [h for h in headers if h[0] in (b"etag", b"last-modified", b"cache-control")]
        return Response(304, kept)
    wanted = None
    if request.method == "GET" and range_applies(validators, request.header(b"if-range")):
        wanted = parse_range_untrusted(request.header(b"range"), st.st_size)
    if isinstance(wanted, Unsatisfiable):
        response.close()
        refused = Response.error(416)
        refused.headers.append((b"content-range", wanted.content_range(st.st_size)))
        return refused
    if isinstance(wanted, ByteRange):
        ranged = [*headers, (b"content-range", wanted.content_range(st.st_size))]
        if body is None:
            return Response(206, ranged, response.body[wanted.start : wanted.end + 1])
        body.offset, body.count = wanted.start, wanted.length
        return Response(206, ranged, region=body)
    return Response(200, headers, response.body, region=body)
