"""parse_head_untrusted against h11: whatever the fast parser accepts, h11 accepts
identically (method, target, HTTP/1.1, lower-cased names and values, no body,
keep-alive, the same bytes left over); what it must not decide it leaves to h11."""

from __future__ import annotations

import h11_mypyc as h11
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from plugins.httpboot.head import parse_head_untrusted

LIMIT = 16 << 10
CURL = b"GET /boot/small.bin HTTP/1.1\r\nHost: 10.0.0.1\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n"


def h11_view(data: bytes):
    """(method, target, headers joined as the connection joins them, keep-alive, the bytes
    after the request) as h11 reads ``data``, or None if it is not one whole request
    without a body."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=LIMIT)
    conn.receive_data(data)
    try:
        request = conn.next_event()
        if not isinstance(request, h11.Request) or conn.they_are_waiting_for_100_continue:
            return None  # the connection would answer 100 Continue first
        if not isinstance(conn.next_event(), h11.EndOfMessage) or conn.their_state is not h11.DONE:
            return None  # a body, or a protocol switch proposed: not kept alive as it is
    except h11.RemoteProtocolError:
        return None
    headers: dict[bytes, bytes] = {}
    for name, value in request.headers:
        headers[name] = headers[name] + b", " + value if name in headers else value
    tokens = [t.strip().lower() for t in headers.get(b"connection", b"").split(b",")]
    keep_alive = request.http_version == b"1.1" and b"close" not in tokens
    return request.method.decode(), request.target, headers, keep_alive, conn.trailing_data[0]


def check_against_h11(data: bytes) -> None:
    head = parse_head_untrusted(data, 0, LIMIT)
    if head is None:
        return
    view = h11_view(data)
    assert view is not None, data
    method, target, headers, keep_alive, rest = view
    assert (head.method, head.target, head.headers) == (method, target, headers)
    assert keep_alive and rest == data[head.end :]


METHODS = [b"POST", b"get", b"PUT", b"OPTIONS", b"G\x00T", b"", b"GET "]
TARGETS = [b"/a b", b"*", b"x", b"/%00", b"/\x80", b"/\x7f", b"http://h/x", b"/\t", b""]
VERSIONS = [b"HTTP/1.0", b"HTTP/2.0", b"http/1.1", b"HTTP/1.1 ", b"HTTP/11", b"HTTP/1.1\r"]
ENDINGS = [b"\n", b"\r", b"\r\n ", b"\r\r\n", b"\n\r"]
PLAIN = [(b"User-Agent", b"curl/7.88.1"), (b"Accept", b"*/*"), (b"X-A", b"a b"),
         (b"Range", b"bytes=0-1"), (b"If-None-Match", b'"1-2-3"'), (b"Connection", b"keep-alive"),
         (b"connection", b"Keep-Alive"), (b"x-empty", b"")]  # fmt: skip
# Headers that matter to h11, with the values that make them matter.
SPECIAL = [(b"Connection", b"close"), (b"Connection", b"keep-alive, close"),
           (b"connection", b"Close"), (b"Connection", b"Upgrade"), (b"Content-Length", b"0"),
           (b"Content-Length", b"5"), (b"Transfer-Encoding", b"chunked"),
           (b"Expect", b"100-continue"), (b"Upgrade", b"h2c"), (b"Host", b"other"),
           (b"HOST", b"10.0.0.1"), (b"bad name", b"x"), (b"", b"x"), (b"X\x7fA", b"x"),
           (b"Host ", b"x")]  # fmt: skip
ODD_VALUES = [b"\x00", b"\x01", b"\x0b", b"\x0c", b"\x7f", b"\x80", b"\xff", b"a\rb", b"a\nb",
              b" a ", b"\ta", b"a\t", b"a \t b", b"\t"]  # fmt: skip


@st.composite
def heads(draw) -> bytes:
    """A head of the accepted kind, then none, one or a few deviations from it."""
    method = draw(st.sampled_from([b"GET", b"HEAD"]))
    target = draw(st.sampled_from([b"/", b"/boot/x?a=1", b"/boot/52-54-00-12-34-56.ipxe"]))
    version, end, separator = b"HTTP/1.1", b"\r\n", b": "
    fields = [(b"Host", b"10.0.0.1"), *draw(st.lists(st.sampled_from(PLAIN), max_size=4))]
    tail = b""
    for deviation in draw(st.lists(st.integers(0, 12), max_size=3)):
        if deviation == 0:
            method = draw(st.sampled_from(METHODS))
        elif deviation == 1:
            target = draw(st.sampled_from(TARGETS))
        elif deviation == 2:
            version = draw(st.sampled_from(VERSIONS))
        elif deviation == 3:
            end = draw(st.sampled_from(ENDINGS))
        elif deviation == 4:
            separator = draw(st.sampled_from([b":", b":\t", b" : ", b":  ", b"::"]))
        elif deviation in (5, 11, 12):  # a header that matters
            fields.insert(draw(st.integers(0, len(fields))), draw(st.sampled_from(SPECIAL)))
        elif deviation == 6:  # a value h11 may take or refuse
            fields.insert(
                draw(st.integers(0, len(fields))), (b"X-B", draw(st.sampled_from(ODD_VALUES)))
            )
        elif deviation == 7 and fields:  # the same header again, or one dropped
            field = fields[draw(st.integers(0, len(fields) - 1))]
            if draw(st.booleans()):
                fields.append(field)
            else:
                fields.remove(field)
        elif deviation == 8:  # a folded line
            fields.append((b" folded", b"x"))
        elif deviation == 9:
            tail = draw(st.sampled_from([b"GET / HTTP/1.1\r\n", b"x", CURL, b"\r\n"]))
        else:
            tail = b"CUT"
    lines = [method + b" " + target + b" " + version]
    lines += [
        name + separator + value if not name.startswith(b" ") else name for name, value in fields
    ]
    data = end.join(lines) + end + end
    if tail == b"CUT":
        return data[: draw(st.integers(0, len(data)))]
    return data + tail


@given(heads())
@example(CURL)
@example(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
@example(b"GET / HTTP/1.1\r\nConnection: keep-alive\r\nHost: a\r\n\r\n")
def test_whatever_it_accepts_h11_accepts_identically(data):
    check_against_h11(data)


@given(st.binary(max_size=200))
def test_random_bytes(data):
    check_against_h11(data)


@given(heads(), st.integers(0, 200), st.binary(min_size=1, max_size=3))
def test_mutated_heads(data, at, inserted):
    at = min(at, len(data))
    check_against_h11(data[:at] + inserted + data[at:])
    check_against_h11(data[:at] + data[at + 1 :])


def test_the_common_heads_are_taken():
    head = parse_head_untrusted(CURL + CURL, 0, LIMIT)
    assert head is not None and head.method == "GET" and head.target == b"/boot/small.bin"
    assert head.headers[b"host"] == b"10.0.0.1" and head.end == len(CURL)
    second = parse_head_untrusted(CURL + CURL, head.end, LIMIT)
    assert second is not None and second.end == 2 * len(CURL)
    ipxe = b"HEAD /boot/x HTTP/1.1\r\nConnection: keep-alive\r\nHost: h\r\nUser-Agent: iPXE/1.21\r\n\r\n"
    assert parse_head_untrusted(ipxe, 0, LIMIT) is not None
    assert parse_head_untrusted(b"GET / HTTP/1.1\r\nHost:\r\n\r\n", 0, LIMIT) is not None


@pytest.mark.parametrize(
    "data",
    [
        CURL[:-1],  # not complete
        CURL.replace(b"HTTP/1.1", b"HTTP/1.0"),
        CURL.replace(b"GET", b"POST"),
        CURL.replace(b"\r\n", b"\n"),
        CURL.replace(b"Accept: */*", b"Connection: close"),
        CURL.replace(b"Accept: */*", b"Connection: keep-alive, Upgrade"),
        CURL.replace(b"Accept: */*", b"Content-Length: 0"),
        CURL.replace(b"Accept: */*", b"Transfer-Encoding: chunked"),
        CURL.replace(b"Accept: */*", b"Expect: 100-continue"),
        CURL.replace(b"Accept: */*", b"Upgrade: h2c"),
        CURL.replace(b"Accept: */*", b"Host: again"),
        CURL.replace(b"Host: 10.0.0.1\r\n", b""),
        CURL.replace(b"Accept: */*", b"Accept: a\r\n b"),  # a folded line
        CURL.replace(b"*/*", b"\x01"),  # h11 takes it, the fast path leaves it
        CURL.replace(b"*/*", b"caf\xc3\xa9"),
        b"\r\n" + CURL,
    ],
)
def test_what_it_leaves_to_h11(data):
    assert parse_head_untrusted(data, 0, LIMIT) is None


def test_a_head_over_the_cap_is_left_to_h11():
    big = CURL.replace(b"Accept: */*", b"X-Big: " + b"a" * 100)
    assert parse_head_untrusted(big, 0, len(big)) is not None
    assert parse_head_untrusted(big, 0, len(big) - 1) is None
