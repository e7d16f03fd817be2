"""A whole file fitted to the request: 200, 206, 304, 416, content types."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from plugins.httpboot.conditional import Validators
from plugins.httpboot.files import content_type, fit_to_request
from plugins.httpboot.messages import Request, Response

SIZE, MTIME_NS, INODE = 1000, 784111777_000000000, 9
STAT = SimpleNamespace(st_size=SIZE, st_mtime_ns=MTIME_NS, st_ino=INODE)  # what is read of it
ETAG = Validators.of_file(SIZE, MTIME_NS, INODE).etag


def fitted(method: str = "GET", path: str = "/boot/ipxe.efi", **headers: bytes) -> Response:
    names = {k.replace("_", "-").encode(): v for k, v in headers.items()}
    request = Request(method, path, b"", names, ("10.0.0.5", 1234), ("10.0.0.1", 80))
    handle = io.BytesIO(b"x" * SIZE)
    return fit_to_request(request, Response.file(handle, STAT))


def header(response: Response, name: bytes) -> bytes | None:
    return dict(response.headers).get(name)


def test_whole_file_with_validators():
    response = fitted()
    assert response.status == 200 and len(response.region) == SIZE
    assert header(response, b"etag") == ETAG
    assert header(response, b"last-modified") == b"Sun, 06 Nov 1994 08:49:37 GMT"
    assert header(response, b"accept-ranges") == b"bytes"
    assert header(response, b"content-type") == b"application/efi"


def test_range_206_and_416():
    partial = fitted(range=b"bytes=10-19")
    assert partial.status == 206 and (partial.region.offset, partial.region.count) == (10, 10)
    assert header(partial, b"content-range") == b"bytes 10-19/1000"
    refused = fitted(range=b"bytes=1000-")
    assert refused.status == 416 and header(refused, b"content-range") == b"bytes */1000"
    assert fitted(range=b"bytes=0-1,5-6").status == 200
    assert fitted("HEAD", range=b"bytes=10-19").status == 200  # Range is for GET


def test_if_range_decides_whether_the_range_applies():
    assert fitted(range=b"bytes=10-19", if_range=ETAG).status == 206
    assert fitted(range=b"bytes=10-19", if_range=b'"stale"').status == 200


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_not_modified(method):
    response = fitted(method, if_none_match=ETAG)
    assert response.status == 304 and response.region is None
    assert {name for name, _ in response.headers} == {b"etag", b"last-modified"}
    assert fitted(method, if_modified_since=b"Sun, 06 Nov 1994 08:49:37 GMT").status == 304
    assert fitted(method, if_none_match=b'"other"').status == 200


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/boot/ipxe.EFI", b"application/efi"),
        ("/boot/x.ipxe", b"text/plain; charset=utf-8"),
        ("/boot/vmlinuz", b"application/octet-stream"),
        ("/boot/disk.iso", b"application/vnd.efi-iso"),
    ],
)
def test_content_types(path, kind):
    assert content_type(path) == kind
