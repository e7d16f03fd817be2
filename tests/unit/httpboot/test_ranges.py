"""Single byte ranges (RFC 9110 14.1.2): 206, 416, or ignored."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.httpboot.ranges import UNSATISFIABLE, ByteRange, parse_range_untrusted

CASES = [
    (b"bytes=0-0", 100, ByteRange(0, 0)),
    (b"bytes=0-99", 100, ByteRange(0, 99)),
    (b"bytes=10-", 100, ByteRange(10, 99)),
    (b"bytes=90-1000", 100, ByteRange(90, 99)),  # the end is clamped
    (b"bytes=-10", 100, ByteRange(90, 99)),  # a suffix
    (b"bytes=-1000", 100, ByteRange(0, 99)),
    (b"Bytes = 5 - 6", 100, ByteRange(5, 6)),  # case and whitespace tolerated
    (b"bytes=100-", 100, UNSATISFIABLE),
    (b"bytes=100-200", 100, UNSATISFIABLE),
    (b"bytes=-0", 100, UNSATISFIABLE),
    (b"bytes=0-", 0, UNSATISFIABLE),  # nothing to range over in an empty file
    (b"bytes=-5", 0, UNSATISFIABLE),
    (None, 100, None),
    (b"bytes=5-4", 100, None),  # invalid: ignored
    (b"bytes=0-1,5-6", 100, None),  # several ranges: the whole file
    (b"items=0-1", 100, None),
    (b"bytes=-", 100, None),
    (b"bytes=a-b", 100, None),
    (b"bytes=" + b"9" * 20 + b"-", 100, None),  # absurd numbers are not parsed
]


@pytest.mark.parametrize(("header", "size", "expected"), CASES)
def test_parse(header, size, expected):
    assert parse_range_untrusted(header, size) == expected


def test_content_range_headers():
    assert ByteRange(2, 3).content_range(7) == b"bytes 2-3/7"
    assert ByteRange(2, 3).length == 2
    assert UNSATISFIABLE.content_range(7) == b"bytes */7"


@given(st.binary(max_size=40), st.integers(min_value=0, max_value=10**12))
def test_a_range_always_lies_inside_the_file(header, size):
    result = parse_range_untrusted(b"bytes=" + header, size)
    if isinstance(result, ByteRange):
        assert 0 <= result.start <= result.end < size
