"""The response head the connection writes itself for a kept-alive HTTP/1.1 exchange
(``_own_head``) is byte for byte what h11 writes for it; what h11 must frame or refuse
(framing headers, a value with a line break, a name that is no token) is left to h11."""

from __future__ import annotations

import h11_mypyc as h11
import pytest

from plugins.httpboot.responsehead import own_head as _own_head
from plugins.httpboot.responsehead import plain_headers as _plain_headers

REQUESTS = [
    b"GET /boot/x HTTP/1.1\r\nHost: a\r\n\r\n",
    b"HEAD /boot/x HTTP/1.1\r\nHost: a\r\n\r\n",
]
RESPONSES = [
    (200, [(b"server", b"rackboot"), (b"etag", b'"1-2-3"'), (b"content-length", b"10")]),
    (206, [(b"content-range", b"bytes 0-1/10"), (b"content-length", b"2")]),
    (304, [(b"etag", b'"1-2-3"'), (b"cache-control", b"no-store")]),
    (404, [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"14")]),
    (599, [(b"x-tab", b"a\tb"), (b"content-length", b"0")]),
]


@pytest.mark.parametrize("raw", REQUESTS)
@pytest.mark.parametrize(("status", "headers"), RESPONSES)
def test_the_head_is_what_h11_writes(raw, status, headers):
    server = h11.Connection(h11.SERVER)
    server.receive_data(raw)
    server.next_event()
    reason = {200: b"OK", 206: b"Partial Content", 304: b"Not Modified", 404: b"Not Found"}
    written = server.send(
        h11.Response(status_code=status, headers=headers, reason=reason.get(status, b""))
    )
    assert _own_head(status, headers) == written


@pytest.mark.parametrize(
    "headers",
    [
        [(b"content-length", b"5")],  # framing: h11's
        [(b"transfer-encoding", b"chunked")],
        [(b"connection", b"close")],
        [(b"x-bad", b"a\r\nset-cookie: injected")],
        [(b"x-bad", b"nul\x00")],
        [(b"bad name", b"v")],
        [(b"", b"v")],
    ],
)
def test_what_h11_must_write_or_refuse_is_left_to_it(headers):
    assert not _plain_headers([(b"content-type", b"text/plain"), *headers])
    assert _plain_headers([(b"content-type", b"text/plain"), (b"x-ok", b"a b\tc\x80")])
