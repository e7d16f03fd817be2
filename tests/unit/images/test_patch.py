"""Runs sent as patches of the receiver's old bytes (plugins/images/patch.py), no I/O."""

from __future__ import annotations

import hashlib
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.images.manifest import Params, Table
from plugins.images.patch import (
    HEADER,
    SPAN,
    SPANS,
    Anchors,
    BadPatch,
    apply_patch_untrusted,
    common_prefix,
    make_patch,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300), st.binary(max_size=300))
def test_a_patch_rebuilds_the_new_bytes_from_the_old(head, middle, tail):
    old = head + os.urandom(len(middle)) + tail
    new = head + middle + tail
    patch = make_patch(new, old)
    assert apply_patch_untrusted(patch, old, len(new)) == new
    assert len(patch) <= SPANS.size + HEADER.size + len(middle) + 3 * SPAN.size


def test_a_small_write_in_a_large_run_costs_its_size():
    old = os.urandom(300_000)
    new = old[:123_457] + b"w" * 4096 + old[123_457 + 4096 :]
    assert len(make_patch(new, old)) == SPANS.size + SPAN.size + 4096
    inserted = old[:70_000] + b"i" * 1000 + old[70_000:]
    assert len(make_patch(inserted, old)) == SPANS.size + HEADER.size + 1000


@pytest.mark.parametrize("n", [0, 1, 65535, 65536, 65537, 200_001])
def test_common_prefix_at_every_step_boundary(n):
    a = os.urandom(300_000)
    b = a[:n] + bytes([a[n] ^ 1]) + a[n + 1 :]
    assert common_prefix(a, b) == n and common_prefix(a, a) == len(a)


def test_a_patch_that_does_not_fit_is_refused():
    old = os.urandom(1000)
    with pytest.raises(BadPatch):
        apply_patch_untrusted(HEADER.pack(900, 900) + b"", old, 1800)  # prefix and suffix overlap
    with pytest.raises(BadPatch):
        apply_patch_untrusted(HEADER.pack(10, 10) + b"xyz", old, 100)  # wrong size
    with pytest.raises(BadPatch):
        apply_patch_untrusted(b"short", old, 5)


def test_anchors_find_what_a_run_replaced():
    ids = [hashlib.sha256(bytes([i])).digest() for i in range(10)]
    sizes = [random.Random(i).randint(1024, 4000) for i in range(10)]
    base = Table(Params(1024, 2048, 4096), tuple(ids), tuple(sizes))
    new_ids = ids[:3] + [b"x" * 32, b"y" * 32] + ids[5:]
    new = Table(base.params, tuple(new_ids), tuple(sizes[:3] + [1500, 1600] + sizes[5:]))
    anchors = Anchors(base)
    offsets = base.offsets()
    assert anchors.range(new, new.offsets(), 3, 5) == (
        offsets[3],
        offsets[5],
    )  # base chunks 3 and 4
    assert (
        anchors.range(new, new.offsets(), 3, 4) is None
    )  # its right neighbour (y) is not in the base
    assert anchors.range(new, new.offsets(), 0, 3) is None  # its right neighbour (x) is new too


def test_a_repeated_neighbour_is_taken_where_the_edit_left_it():
    zero, a, b = (hashlib.sha256(n).digest() for n in (b"zero", b"a", b"b"))
    sizes = (4096,) * 6
    base = Table(Params(1024, 2048, 4096), (zero, a, zero, b, zero, a), sizes)
    new = Table(base.params, (zero, a, zero, b"x" * 32, zero, a), sizes)  # chunk 3 changed
    offsets = base.offsets()
    assert Anchors(base).range(new, new.offsets(), 3, 4) == (offsets[3], offsets[4])


def test_two_writes_far_apart_in_one_run_cost_their_sizes_not_the_gap():
    old = os.urandom(600_000)
    new = bytearray(old)
    new[10_000:14_096] = os.urandom(4096)
    new[500_000:504_096] = os.urandom(4096)
    patch = make_patch(bytes(new), old)
    assert len(patch) == SPANS.size + 2 * SPAN.size + 8192
    assert apply_patch_untrusted(patch, old, len(old)) == bytes(new)
    with pytest.raises(BadPatch):  # a span pushed past the run
        apply_patch_untrusted(patch[:5] + SPAN.pack(599_000, 4096) + patch[17:], old, len(old))
