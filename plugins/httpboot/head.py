"""The common request head, parsed without h11 (sans-IO).

A booting machine, a package manager or wrk sends the same kind of head over
and over: ``GET`` or ``HEAD``, an origin-form target, ``HTTP/1.1``, one
``Host`` and a few plain headers, nothing after it. :func:`parse_head_untrusted`
reads exactly that, in one regular-expression pass, and answers ``None`` for
everything else, which then goes to h11 as before: another method or version, a
body (``Content-Length``, ``Transfer-Encoding``), ``Expect``, ``Upgrade``, a
``Connection`` other than ``keep-alive``, no or several ``Host``, bare ``LF``
line ends, folded lines, control characters or bytes above 0x7e in a value, a
head longer than the cap or not complete yet. Whatever it accepts, h11 accepts
identically (the same method, target, lower-cased names and values, keep-alive,
the same bytes left after the head): tests/unit/httpboot/test_head.py checks it
against h11 with hypothesis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
_VALUE = rb"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?"  # h11's field-value, printable ASCII
_HEAD = re.compile(
    rb"(GET|HEAD) (/[\x21-\x7e]*) HTTP/1\.1\r\n((?:" + _TOKEN + rb":[ \t]*" + _VALUE
    + rb"[ \t]*\r\n)*)\r\n"
)  # fmt: skip
# Headers that change how the message is framed or what follows it: h11 decides those.
_FOR_H11 = frozenset((b"content-length", b"transfer-encoding", b"expect", b"upgrade"))


@dataclass(frozen=True, slots=True)
class SimpleHead:
    method: str  # "GET" or "HEAD"
    target: bytes
    headers: dict[bytes, bytes]  # lower-case names; repeated headers joined with ", "
    end: int  # the offset just past the head in the bytes it was parsed from


def parse_head_untrusted(data: bytes, start: int, max_size: int) -> SimpleHead | None:
    """The request head at ``data[start:]`` if it is the common kind and at most
    ``max_size`` bytes long, else ``None`` (h11's to parse)."""
    match = _HEAD.match(data, start, start + max_size)
    if match is None:
        return None
    headers: dict[bytes, bytes] = {}
    hosts = 0
    for line in match[3].split(b"\r\n")[:-1]:
        raw_name, _, raw_value = line.partition(b":")
        name, value = raw_name.lower(), raw_value.strip(b" \t")
        if name in headers:
            headers[name] += b", " + value
        else:
            headers[name] = value
        if name == b"host":
            hosts += 1
        elif name in _FOR_H11 or (name == b"connection" and value.lower() != b"keep-alive"):
            return None
    if hosts != 1:
        return None
    return SimpleHead(match[1].decode("ascii"), match[2], headers, match.end())
