"""Validators and conditional requests: 304 and If-Range."""

from __future__ import annotations

import pytest

from plugins.httpboot.conditional import (
    Validators,
    http_date,
    not_modified,
    parse_http_date_untrusted,
    range_applies,
)

V = Validators.of_file(size=7, mtime_ns=784111777_123456789, inode=42)
DATE = b"Sun, 06 Nov 1994 08:49:37 GMT"  # = V.mtime


def test_validators_of_a_file():
    assert V.etag == b'"%x-7-2a"' % 784111777_123456789
    assert V.mtime == 784111777 and V.last_modified == DATE
    other = Validators.of_file(size=8, mtime_ns=784111777_123456789, inode=42)
    assert other.etag != V.etag


@pytest.mark.parametrize(
    "value",
    [DATE, b"Sunday, 06-Nov-94 08:49:37 GMT", b"Sun Nov  6 08:49:37 1994"],  # RFC 9110 5.6.7
)
def test_http_dates(value):
    assert parse_http_date_untrusted(value) == 784111777
    assert http_date(784111777) == DATE


@pytest.mark.parametrize("value", [None, b"", b"yesterday", b"\xff\xfe", b"x" * 100])
def test_bad_dates_are_ignored(value):
    assert parse_http_date_untrusted(value) is None


@pytest.mark.parametrize(
    ("inm", "ims", "expected"),
    [
        (V.etag, None, True),
        (b"W/" + V.etag, None, True),  # If-None-Match compares weakly
        (b'"other", ' + V.etag, None, True),
        (b"*", None, True),
        (b'"other"', None, False),
        (b'"other"', DATE, False),  # If-None-Match present: If-Modified-Since is ignored
        (None, DATE, True),
        (None, b"Sun, 06 Nov 1994 08:49:38 GMT", True),
        (None, b"Sun, 06 Nov 1994 08:49:36 GMT", False),  # changed since
        (None, b"garbage", False),
        (None, None, False),
    ],
)
def test_not_modified(inm, ims, expected):
    assert not_modified(V, inm, ims) is expected


@pytest.mark.parametrize(
    ("if_range", "expected"),
    [
        (None, True),
        (V.etag, True),
        (b"W/" + V.etag, False),  # If-Range compares strongly
        (b'"other"', False),
        (DATE, True),
        (b"Sun, 06 Nov 1994 08:49:38 GMT", False),  # a date must match exactly
        (b"garbage", False),
    ],
)
def test_if_range(if_range, expected):
    assert range_applies(V, if_range) is expected
