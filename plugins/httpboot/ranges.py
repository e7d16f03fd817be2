"""``Range: bytes=...`` (RFC 9110 14.1.2) for one range (sans-IO).

A single satisfiable range gets 206; one that starts past the end (or asks for
the last 0 bytes, or any range of an empty file) gets 416. Several ranges, other
units and malformed values are ignored, as RFC 9110 allows: the client gets the
whole representation (200), which every client handles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_RANGE_HEADER = 256
_SPEC = re.compile(rb"[ \t]*bytes[ \t]*=[ \t]*(\d{0,19})[ \t]*-[ \t]*(\d{0,19})[ \t]*", re.I)


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    def content_range(self, size: int) -> bytes:
        return b"bytes %d-%d/%d" % (self.start, self.end, size)


class Unsatisfiable:
    """The single range asked for lies outside the representation: 416."""

    @staticmethod
    def content_range(size: int) -> bytes:
        return b"bytes */%d" % size


UNSATISFIABLE = Unsatisfiable()


def parse_range_untrusted(header: bytes | None, size: int) -> ByteRange | Unsatisfiable | None:
    """The range to send of a ``size``-byte representation; ``None``: send it whole."""
    if header is None or len(header) > MAX_RANGE_HEADER:
        return None
    match = _SPEC.fullmatch(header)
    if match is None:
        return None  # other units, several ranges, garbage: ignored
    first, last = match.group(1), match.group(2)
    if first:
        start = int(first)
        end = int(last) if last else size - 1
        if last and end < start:
            return None  # invalid: ignored
        if start >= size:
            return UNSATISFIABLE
        return ByteRange(start, min(end, size - 1))
    if not last:
        return None  # "bytes=-" is not a range
    suffix = int(last)
    if suffix == 0 or size == 0:
        return UNSATISFIABLE
    return ByteRange(max(0, size - suffix), size - 1)
