"""Response heads written without h11, byte for byte as h11 writes them (sans-IO).

h11 checks and frames every response it writes (~20 µs a head). A kept-alive
HTTP/1.1 exchange whose length is in the headers needs nothing of that when
the handler's own headers frame nothing and hold nothing h11 would refuse:
:func:`plain_headers` says when, :func:`own_head` writes it
(tests/unit/httpboot/test_own_head.py compares the bytes with h11's).
"""

from __future__ import annotations

import re
from http import HTTPStatus

REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}

# What h11 would accept in a header it writes (RFC 9110 5.1, 5.5): a token, and a value
# without control characters but tab. A handler's header outside them goes through h11.
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*")
_FRAMING = (b"content-length", b"transfer-encoding", b"connection")


def plain_headers(headers: list[tuple[bytes, bytes]]) -> bool:
    """A handler's headers that can be written as they are (no framing of its own)."""
    for name, value in headers:
        if (name in _FRAMING or _FIELD_NAME.fullmatch(name) is None
                or _FIELD_VALUE.fullmatch(value) is None):  # fmt: skip
            return False
    return True


def own_head(status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A response head as h11 writes it for a kept-alive HTTP/1.1 exchange whose length
    is in ``headers`` (or that has no body: HEAD, 304)."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b""))]
    lines += [b"%s: %s\r\n" % header for header in headers]
    lines.append(b"\r\n")
    return b"".join(lines)
