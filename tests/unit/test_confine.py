"""Path confinement (appliance/confine.py) against real directories, symlinks and special files.

TFTP (tests/unit/tftp/test_confine.py) and HTTP boot reuse these tables."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from appliance import confine
from appliance.confine import Denied, NotFound, Refused, open_confined, resolve_untrusted

DENIED, MISSING = Denied, NotFound


@pytest.fixture
def tree(tmp_path):
    """root/ with boot files and planted links; outside/ with a secret next to it."""
    root, outside = tmp_path / "srv" / "tftp", tmp_path / "outside"
    (root / "pxelinux.cfg").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (root / "pxelinux.0").write_bytes(b"pxe" * 100)
    (root / "pxelinux.cfg" / "01-aa-bb-cc-dd-ee-ff").write_text("default local\n")
    (root / "%2e%2e").write_text("literal")
    (root / "to-secret").symlink_to(outside / "secret")
    (root / "to-outside-dir").symlink_to(outside)
    (root / "relative-escape").symlink_to("../../outside/secret")
    (root / "to-boot").symlink_to("pxelinux.0")
    (root / "cfg-link").symlink_to(root / "pxelinux.cfg")
    (root / "dangling-in").symlink_to("nothing-here")
    (root / "dangling-out").symlink_to(outside / "nothing-here")
    (root / "to-root").symlink_to(".")
    (root / "to-dev-null").symlink_to("/dev/null")
    os.mkfifo(root / "fifo")
    (root / os.fsdecode(b"caf\xe9")).write_bytes(b"latin-1 name")
    return root


ALLOWED = [
    ("pxelinux.0", "pxelinux.0"),
    ("/pxelinux.0", "pxelinux.0"),  # leading slash is relative to the root (tftpd-hpa -s)
    ("//pxelinux.0", "pxelinux.0"),
    ("./pxelinux.0", "pxelinux.0"),
    ("pxelinux.cfg/01-aa-bb-cc-dd-ee-ff", "pxelinux.cfg/01-aa-bb-cc-dd-ee-ff"),
    ("pxelinux.cfg//01-aa-bb-cc-dd-ee-ff", "pxelinux.cfg/01-aa-bb-cc-dd-ee-ff"),
    ("%2e%2e", "%2e%2e"),  # no URL decoding: a literal name
    ("to-boot", "pxelinux.0"),  # symlink inside -> inside
    ("cfg-link/01-aa-bb-cc-dd-ee-ff", "pxelinux.cfg/01-aa-bb-cc-dd-ee-ff"),
    ("to-root/pxelinux.0", "pxelinux.0"),
    (os.fsdecode(b"caf\xe9"), os.fsdecode(b"caf\xe9")),  # non-UTF-8 bytes, as the codec decodes
]

REFUSED = [
    ("", DENIED),
    ("/", DENIED),
    (".", DENIED),
    ("pxelinux.cfg", DENIED),  # a directory
    ("to-root", DENIED),
    ("fifo", DENIED),
    ("to-dev-null", DENIED),  # outside, and a device
    ("pxelinux.0\0.cfg", DENIED),
    ("..", DENIED),
    ("../outside/secret", DENIED),
    ("/../outside/secret", DENIED),
    ("pxelinux.cfg/../pxelinux.0", DENIED),  # any '..' component, even one staying inside
    ("pxelinux.cfg/../../../outside/secret", DENIED),
    ("boot\\pxelinux.0", DENIED),
    ("..\\..\\outside\\secret", DENIED),
    ("to-secret", DENIED),  # symlink inside -> outside
    ("relative-escape", DENIED),
    ("to-outside-dir/secret", DENIED),
    ("dangling-out", DENIED),
    ("dangling-in", MISSING),
    ("nope", MISSING),
    ("%2e%2e/pxelinux.0", MISSING),  # "%2e%2e" is a file, not a directory
    ("pxelinux.0/x", MISSING),
    ("/etc/passwd", MISSING),  # relative to the root: root/etc/passwd does not exist
]


@pytest.mark.parametrize(("requested", "target"), ALLOWED)
def test_allowed(tree, requested, target):
    assert resolve_untrusted(tree, requested) == Path(os.path.realpath(tree / target))
    handle, st = open_confined(tree, requested)
    with handle:
        content = handle.read()
    assert st.st_size == len(content) == (tree / target).stat().st_size


def reveals_nothing(message: str, requested: str, tree: Path) -> bool:
    rest = message.replace(requested, "")
    return not any(s in rest for s in (str(tree), os.path.realpath(tree), "srv", "outside/"))


@pytest.mark.parametrize(("requested", "kind"), REFUSED)
def test_refused_without_revealing_the_root(tree, requested, kind):
    for attempt in (resolve_untrusted, open_confined):
        with pytest.raises(Refused) as info:
            attempt(tree, requested)
        assert type(info.value) is kind
        assert info.value.requested == requested and requested in str(info.value)
        assert reveals_nothing(str(info.value), requested, tree)


def test_root_given_through_a_symlink(tree, tmp_path):
    (tmp_path / "root-link").symlink_to(tree)
    assert resolve_untrusted(tmp_path / "root-link", "to-boot") == Path(
        os.path.realpath(tree / "pxelinux.0")
    )
    with pytest.raises(Refused):
        resolve_untrusted(tmp_path / "root-link", "to-secret")


def test_device_node_is_refused(tree):
    try:
        os.mknod(tree / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("cannot create device nodes here")
    with pytest.raises(Denied):
        open_confined(tree, "null")


def test_unreadable_file_is_an_access_violation(tree, monkeypatch):
    def deny(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tree / "pxelinux.0"))

    monkeypatch.setattr(confine.os, "open", deny)
    with pytest.raises(Denied) as info:
        open_confined(tree, "pxelinux.0")
    assert str(tree) not in str(info.value)


def test_final_component_swapped_for_a_symlink_after_resolution(tree, monkeypatch):
    swapped = tree / "swapped"
    swapped.symlink_to(tree.parent.parent / "outside" / "secret")
    monkeypatch.setattr(confine, "resolve_untrusted", lambda root, requested: swapped)
    with pytest.raises(Denied):  # O_NOFOLLOW: ELOOP
        open_confined(tree, "pxelinux.0")


def test_directory_swapped_for_a_symlink_after_resolution(tree, monkeypatch):
    escaped = tree / "to-outside-dir" / "secret"  # what the path means after the swap
    monkeypatch.setattr(confine, "resolve_untrusted", lambda root, requested: escaped)
    with pytest.raises(Denied):  # the descriptor points outside the root
        open_confined(tree, "pxelinux.cfg/secret")


def test_fifo_swapped_in_after_resolution_does_not_block(tree, monkeypatch):
    monkeypatch.setattr(confine, "resolve_untrusted", lambda root, requested: tree / "fifo")
    with pytest.raises(Refused):
        open_confined(tree, "pxelinux.0")


def test_open_file_streams_by_offset(tree):
    handle, st = open_confined(tree, "pxelinux.0")
    with handle:
        assert os.pread(handle.fileno(), 6, st.st_size - 6) == b"pxepxe"
        assert handle.fileno() >= 0 and not os.get_inheritable(handle.fileno())


def flip_forever(cur: Path, stop: threading.Event, limit: float) -> None:
    """Turn ``cur`` into a symlink, a regular file and nothing, over and over, until
    ``stop`` (or ``limit`` seconds): each state a resolver may meet half-way through."""
    spare = cur.with_name("spare")
    deadline = time.monotonic() + limit
    while not stop.is_set() and time.monotonic() < deadline:
        spare.symlink_to("boot")
        os.replace(spare, cur)  # a symlink to a directory inside the root
        spare.write_bytes(b"plain")
        os.replace(spare, cur)  # no longer a symlink: readlink() of it says EINVAL
        os.unlink(cur)  # gone: lstat()/readlink() say ENOENT


def test_resolution_racing_a_symlink_swap_only_refuses(tmp_path):
    """A symlink swapped while a name resolves (an operator's `ln -sfn`, a sync tool)
    made os.path.realpath raise OSError (EINVAL, ENOENT) past the refusals: TFTP then
    answered nothing, HTTP a 500. Every outcome must be a file or a refusal."""
    root = tmp_path / "root"
    (root / "boot").mkdir(parents=True)
    (root / "boot" / "pxelinux.0").write_bytes(b"pxe")
    stop = threading.Event()
    flipper = threading.Thread(target=flip_forever, args=(root / "cur", stop, 10.0))
    flipper.start()
    outcomes: Counter[str] = Counter()
    try:
        deadline = time.monotonic() + 3.0
        for _ in range(20_000):
            if time.monotonic() > deadline:
                break
            for attempt in (resolve_untrusted, open_confined):
                try:
                    found = attempt(root, "cur/pxelinux.0")
                except Refused as refused:
                    outcomes[type(refused).__name__] += 1
                else:
                    outcomes["served"] += 1
                    if isinstance(found, tuple):
                        found[0].close()
    finally:
        stop.set()
        flipper.join(timeout=10)
    assert outcomes["served"] and outcomes["NotFound"], outcomes  # the race was run
