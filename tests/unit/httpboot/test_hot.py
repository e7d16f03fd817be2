"""Small files kept in memory (plugins/httpboot/hot.py) and served through the static
route: fresh after every kind of change, confined as the full resolution is, conditional
and Range requests answered from the kept bytes. Clocks are explicit."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from plugins.httpboot.beneath import BeneathRoot
from plugins.httpboot.files import content_type, fit_to_request
from plugins.httpboot.hot import HOT_FILE_BYTES, RECHECK_SECONDS, HotFiles
from plugins.httpboot.messages import Request, Response
from tests.trio.test_httpboot_plugin import builtin_routes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "dir").mkdir(parents=True)
    (root / "dir" / "a.cfg").write_bytes(b"first")
    (root / "small.bin").write_bytes(b"0123456789")
    return root


@pytest.fixture
def hot(root: Path):
    beneath = BeneathRoot(root)
    if not beneath.available or beneath.open("small.bin") is None:
        pytest.skip("no openat2 here (Linux 5.6+)")
    clock = Clock()
    # fresh_seconds 0: the test's files were all written a moment ago
    yield HotFiles(beneath, content_type, clock, lambda: 2e9, fresh_seconds=0.0), clock
    beneath.close()


def kept(files: HotFiles, name: str):
    """What the static route does: the kept file, else open and keep."""
    found = files.get(name)
    if found is not None:
        return found
    opened = files.beneath.open(name)
    if opened is None:
        return None
    with opened[0]:
        return files.keep(name, *opened)


def test_a_kept_file_is_served_without_an_open_until_it_changes(hot, root, monkeypatch):
    files, _ = hot
    first = kept(files, "dir/a.cfg")
    assert first is not None and first.content == b"first"
    assert dict(first.headers)[b"content-type"] == b"text/plain; charset=utf-8"
    monkeypatch.setattr(files.beneath, "open", lambda name: pytest.fail("opened again"))
    assert files.get("dir/a.cfg") is first
    monkeypatch.undo()
    (root / "dir" / "a.cfg").write_bytes(b"second, longer")  # written in place
    assert files.get("dir/a.cfg") is None
    assert kept(files, "dir/a.cfg").content == b"second, longer"
    (root / "new.cfg").write_bytes(b"third")
    os.replace(root / "new.cfg", root / "dir" / "a.cfg")  # renamed over it
    assert files.get("dir/a.cfg") is None and kept(files, "dir/a.cfg").content == b"third"
    (root / "dir" / "a.cfg").unlink()
    assert files.get("dir/a.cfg") is None and kept(files, "dir/a.cfg") is None


def test_a_symlink_or_a_swapped_directory_leading_out_is_never_served(hot, root, tmp_path):
    files, clock = hot
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "small.bin").write_bytes(b"SECRET-OUT")
    assert kept(files, "small.bin").content == b"0123456789"
    (root / "small.bin").unlink()
    (root / "small.bin").symlink_to(outside / "small.bin")
    assert files.get("small.bin") is None  # another inode by that name now
    assert files.beneath.open("small.bin") is None  # and the full way refuses it
    # The one change a stat by name cannot see: the file's own directory moved out and a
    # symlink in its place (the same inode, one link): openat2 again within RECHECK_SECONDS.
    assert kept(files, "dir/a.cfg").content == b"first"
    shutil.move(root / "dir", outside / "dir")
    (root / "dir").symlink_to(outside / "dir")
    clock.now += RECHECK_SECONDS
    assert files.get("dir/a.cfg") is None and kept(files, "dir/a.cfg") is None


def test_what_is_never_kept(hot, root):
    files, _ = hot
    (root / "big.bin").write_bytes(b"x" * (HOT_FILE_BYTES + 1))
    os.link(root / "small.bin", root / "twin.bin")  # a second name: it could be outside
    assert kept(files, "big.bin") is None and kept(files, "twin.bin") is None
    assert kept(files, "small.bin") is None  # its link count is 2 now too
    recent = HotFiles(files.beneath, content_type, lambda: 0.0, lambda: os.stat(root).st_ctime)
    assert kept(recent, "dir/a.cfg") is None  # changed within FRESH_SECONDS: maybe mid-write


def request(**headers: bytes) -> Request:
    names = {k.replace("_", "-").encode(): v for k, v in headers.items()}
    return Request("GET", "/boot/small.bin", b"", names, ("10.0.0.5", 1), ("10.0.0.1", 80))


def test_conditional_and_range_requests_on_kept_bytes_answer_as_on_an_open_file(hot, root):
    files, _ = hot
    file = kept(files, "small.bin")

    def both(**headers: bytes) -> tuple[Response, Response]:
        opened = files.beneath.open("small.bin")
        from_disk = fit_to_request(request(**headers), Response.file(*opened))
        from_memory = fit_to_request(
            request(**headers), Response.kept(file.content, file.stat, file.headers)
        )
        if from_disk.region is not None:
            region = from_disk.region
            from_disk.body = os.pread(region.handle.fileno(), region.count, region.offset)
            from_disk.region = None
        from_disk.close()
        opened[0].close()
        return from_disk, from_memory

    etag = dict(file.headers)[b"etag"]
    for headers in ({}, {"range": b"bytes=2-4"}, {"range": b"bytes=-3"}, {"range": b"bytes=50-"},
                    {"if_none_match": etag}, {"if_none_match": b'"other"'},
                    {"if_modified_since": b"Sun, 06 Nov 2094 08:49:37 GMT"},
                    {"range": b"bytes=1-2", "if_range": b'"other"'}):  # fmt: skip
        disk, memory = both(**headers)
        assert (memory.status, memory.headers, memory.body) == (
            disk.status,
            disk.headers,
            disk.body,
        )


def test_the_static_route_serves_kept_files_and_still_refuses(tmp_path, root, monkeypatch):
    routes = builtin_routes(tmp_path, root=root)
    routes.hot.fresh_seconds = 0.0

    def get(path: str) -> Response:
        return routes.static(Request("GET", "/boot/" + path, b"", {}, ("10.0.0.5", 1),
                                     ("10.0.0.1", 80), params={"path": path}))  # fmt: skip

    assert get("small.bin").body == b"0123456789"  # kept on the way
    assert "small.bin" in routes.hot.files
    (tmp_path / "secret").write_bytes(b"SECRET")
    (root / "link").symlink_to(tmp_path / "secret")
    for refused in ("link", "../secret", "dir/../../secret"):
        assert get(refused).status in (403, 404)
    assert all(b"SECRET" not in getattr(file, "content", b"") for file in routes.hot.files.values())
