"""The openat2 fast path (plugins/httpboot/beneath.py) against confinement's own tables:
it serves only what ``open_confined`` serves, the same file, and leaves every refusal
to it; the root's descriptor follows the root when it is swapped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from appliance.confine import open_confined
from plugins.httpboot.beneath import BeneathRoot, plain_name
from tests.unit.test_confine import ALLOWED, REFUSED, tree  # noqa: F401 (the fixture)

# Reached only through an absolute symlink: RESOLVE_BENEATH refuses those, the slow path serves.
ABSOLUTE_LINKS = {"cfg-link/01-aa-bb-cc-dd-ee-ff"}


@pytest.fixture
def beneath(tree):  # noqa: F811
    fast = BeneathRoot(tree)
    if not fast.available or fast.open("pxelinux.0") is None:
        pytest.skip("no openat2 here (Linux 5.6+)")
    yield fast
    fast.close()


def identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


@pytest.mark.parametrize(("requested", "target"), ALLOWED)
def test_it_serves_what_confinement_serves_and_the_same_file(tree, beneath, requested, target):  # noqa: F811
    opened = beneath.open(requested)
    if requested in ABSOLUTE_LINKS:
        assert opened is None  # left to open_confined
        return
    assert opened is not None
    handle, st = opened
    slow, slow_st = open_confined(tree, requested)
    with handle, slow:
        assert identity(st) == identity(slow_st) == identity((tree / target).stat())
        assert handle.read() == slow.read()


@pytest.mark.parametrize(("requested", "kind"), REFUSED)
def test_every_refusal_is_left_to_confinement(beneath, requested, kind):
    assert beneath.open(requested) is None


def test_names_it_never_resolves():
    for name in ("", "/", "//", "a/../b", "..", "a\\b", "a\0b"):
        assert plain_name(name) is None
    assert plain_name("/boot/x.efi") == "boot/x.efi"


def test_a_file_replaced_on_disk_is_served_fresh(tree, beneath):  # noqa: F811
    handle, _ = beneath.open("pxelinux.0")
    handle.close()
    staged = tree / ".new"
    staged.write_bytes(b"new contents")
    os.replace(staged, tree / "pxelinux.0")
    handle, st = beneath.open("pxelinux.0")
    with handle:
        assert handle.read() == b"new contents" and st.st_size == 12


def test_a_root_symlink_repointed_is_followed_at_the_next_request(tmp_path):
    old, new = tmp_path / "v1", tmp_path / "v2"
    for version in (old, new):
        version.mkdir()
        (version / "ipxe.efi").write_bytes(version.name.encode())
    (new / "only-in-v2").write_bytes(b"2")
    link = tmp_path / "root"
    link.symlink_to(old)
    fast = BeneathRoot(link)
    try:
        handle, _ = fast.open("ipxe.efi")
        with handle:
            assert handle.read() == b"v1"
        staged = tmp_path / "root.new"
        staged.symlink_to(new)
        os.replace(staged, link)
        handle, _ = fast.open("ipxe.efi")
        with handle:
            assert handle.read() == b"v2"
        assert fast.open("only-in-v2") is not None
    finally:
        fast.close()


def test_a_directory_swapped_in_under_a_name_on_the_path_cannot_lead_out(tmp_path):
    """A directory of the path replaced by a symlink to outside: the kernel refuses it
    during the resolution itself (EXDEV), whatever the timing."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "images").mkdir(parents=True)
    outside.mkdir()
    (root / "images" / "kernel").write_bytes(b"inside")
    (outside / "kernel").write_bytes(b"secret")
    fast = BeneathRoot(root)
    try:
        assert fast.open("images/kernel") is not None
        (root / "images" / "kernel").unlink()
        (root / "images").rmdir()
        (root / "images").symlink_to(outside)
        assert fast.open("images/kernel") is None
        (root / "images").unlink()
        (root / "images").symlink_to(Path("..") / "outside")
        assert fast.open("images/kernel") is None
    finally:
        fast.close()
