"""Validators and conditional requests (RFC 9110 8.8, 13) for files (sans-IO).

Evaluated as RFC 9110 13.2.2 orders them for GET and HEAD: ``If-None-Match``
(weak comparison, ``*`` matches), else ``If-Modified-Since``; either makes a
304. ``If-Range`` (strong comparison, or the exact ``Last-Modified`` date)
decides whether a ``Range`` applies. ``If-Match`` and ``If-Unmodified-Since``
concern writes, which static files never get; they are ignored.
"""

from __future__ import annotations

import email.utils
import functools
from dataclasses import dataclass
from datetime import UTC

MAX_VALIDATOR_HEADER = 1024


@dataclass(frozen=True)
class Validators:
    etag: bytes  # quoted, strong
    mtime: int  # whole seconds, as Last-Modified carries them

    @classmethod
    def of_file(cls, size: int, mtime_ns: int, inode: int) -> Validators:
        return _file_validators(size, mtime_ns, inode)

    @property
    def last_modified(self) -> bytes:
        return _file_date(self.mtime)


def http_date(timestamp: float) -> bytes:
    """IMF-fixdate (``Sun, 06 Nov 1994 08:49:37 GMT``)."""
    return email.utils.formatdate(timestamp, usegmt=True).encode("ascii")


# A served file asks for the same validators on every request: built once per version of
# the file (size, mtime, inode: a file replaced on disk is a new key), formatting a date
# costs ~10 µs. Bounded; what falls out is only built again.
@functools.lru_cache(maxsize=1024)
def _file_validators(size: int, mtime_ns: int, inode: int) -> Validators:
    return Validators(b'"%x-%x-%x"' % (mtime_ns, size, inode), mtime_ns // 1_000_000_000)


@functools.lru_cache(maxsize=1024)
def _file_date(mtime: int) -> bytes:
    return http_date(mtime)


def parse_http_date_untrusted(value: bytes | None) -> int | None:
    """Seconds since the epoch of an HTTP date (any of the three RFC 9110 formats), else None."""
    if value is None or len(value) > 64:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value.decode("ascii"))
    except (ValueError, TypeError, UnicodeDecodeError, IndexError):
        return None
    if parsed.tzinfo is None:  # RFC 850 and asctime dates are GMT by definition
        return int(parsed.replace(tzinfo=UTC).timestamp())
    return int(parsed.timestamp())


def _tags(header: bytes) -> list[bytes]:
    return [tag.strip() for tag in header.split(b",") if tag.strip()]


def _opaque(tag: bytes) -> bytes:
    return tag[2:] if tag.startswith(b"W/") else tag


def not_modified(
    validators: Validators, if_none_match: bytes | None, if_modified_since: bytes | None
) -> bool:
    """Whether a GET or HEAD is answered 304."""
    if if_none_match is not None:
        if len(if_none_match) > MAX_VALIDATOR_HEADER:
            return False
        if if_none_match.strip() == b"*":
            return True
        ours = _opaque(validators.etag)
        return any(_opaque(tag) == ours for tag in _tags(if_none_match))
    since = parse_http_date_untrusted(if_modified_since)
    return since is not None and validators.mtime <= since


def range_applies(validators: Validators, if_range: bytes | None) -> bool:
    """Whether a ``Range`` is honoured given ``If-Range`` (absent: yes)."""
    if if_range is None:
        return True
    value = if_range.strip()
    if value.startswith((b'"', b"W/")):
        return value == validators.etag  # strong comparison: a weak tag never matches
    return parse_http_date_untrusted(value) == validators.mtime
