"""A run of chunks sent as a patch of the bytes the receiver already has (sans-IO).

Content-defined chunks keep an edit local, but a chunk is all or nothing: 20
scattered 4 KiB writes cost 20 chunks (~1.6 MB at the default 80 KiB average)
where rsync sends ~20 of its blocks. When the receiver holds an older version
of the same image, a run of changed chunks sits between two chunks both
versions share (its *anchors*); the bytes between the anchors in the old
version are what the run replaced. The receiver names that range, the sender
compares the two and sends only what differs: for an in-place edit (same length) each
span that differs, for an insertion or deletion the lengths of the common prefix
and suffix and the bytes between (a 4 KiB write inside a chunk: ~4 KiB). The receiver rebuilds the run from its own old bytes and checks
every chunk against its id as always: a patch can be wrong, never accepted wrong.
"""

from __future__ import annotations

import struct

from .manifest import Table

SPANS = struct.Struct("<BI")  # kind, span count
SPAN = struct.Struct("<QI")  # offset, length
HEADER = struct.Struct("<QQ")  # SHIFTED: common prefix, common suffix
IN_PLACE, SHIFTED = 1, 2
STEP = 64 * 1024
BLOCK = 1024  # granularity of in-place spans (the ends are exact)
MAX_PATCH_HEAD = 1 << 20  # a patch's own bytes beyond its data, at most
CONTENT_TYPE = b"application/x-rackboot-patch"


class BadPatch(ValueError):
    pass


def common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes ``a`` and ``b`` share (slices compare with memcmp)."""
    n = min(len(a), len(b))
    i = 0
    while i + STEP <= n and a[i : i + STEP] == b[i : i + STEP]:
        i += STEP
    lo, hi = i, min(i + STEP, n)  # a[:lo] == b[:lo]; the first difference is before hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def make_patch(new: bytes, old: bytes) -> bytes:
    """``new`` against ``old``: an in-place edit (same length) as the spans that differ,
    each ``[offset, length]`` + its bytes; otherwise the common prefix and suffix
    lengths + the bytes between (an insertion or a deletion)."""
    if len(new) == len(old):
        spans = _differing(new, old)
        header = SPANS.pack(IN_PLACE, len(spans)) + b"".join(SPAN.pack(a, b - a) for a, b in spans)
        return header + b"".join(new[a:b] for a, b in spans)
    prefix = common_prefix(new, old)
    limit = min(len(new), len(old)) - prefix  # the suffix must not overlap the prefix
    suffix = min(common_prefix(new[::-1], old[::-1]), limit)
    return SPANS.pack(SHIFTED, 0) + HEADER.pack(prefix, suffix) + new[prefix : len(new) - suffix]


def _differing(new: bytes, old: bytes) -> list[tuple[int, int]]:
    """Maximal spans where two equally long byte strings differ (blocks compared, the
    ends of each span found to the byte); spans closer than BLOCK are merged."""
    spans: list[tuple[int, int]] = []
    n, at = len(new), 0
    while at < n:
        at += common_prefix(new[at:], old[at:])
        if at >= n:
            break
        end = at
        while end < n and new[end : end + BLOCK] != old[end : end + BLOCK]:
            end += BLOCK
        end = min(end, n)
        # back from the first equal block to the last differing byte
        end -= common_prefix(new[at:end][::-1], old[at:end][::-1])
        if spans and at - spans[-1][1] < BLOCK:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((at, end))
        at = end
    return spans


def apply_patch_untrusted(patch: bytes, old: bytes, size: int) -> bytes:
    """The ``size`` bytes a patch makes of ``old``; :class:`BadPatch` if it cannot."""
    if len(patch) < SPANS.size:
        raise BadPatch("patch shorter than its header")
    kind, count = SPANS.unpack_from(patch)
    if kind == IN_PLACE:
        if size != len(old) or len(patch) < SPANS.size + count * SPAN.size:
            raise BadPatch("an in-place patch of another length")
        out = bytearray(old)
        at = SPANS.size + count * SPAN.size
        for k in range(count):
            offset, length = SPAN.unpack_from(patch, SPANS.size + k * SPAN.size)
            if offset + length > size or at + length > len(patch):
                raise BadPatch("a span outside the run")
            out[offset : offset + length] = patch[at : at + length]
            at += length
        if at != len(patch):
            raise BadPatch("bytes after the last span")
        return bytes(out)
    if kind != SHIFTED or len(patch) < SPANS.size + HEADER.size:
        raise BadPatch("an unknown patch")
    prefix, suffix = HEADER.unpack_from(patch, SPANS.size)
    middle = memoryview(patch)[SPANS.size + HEADER.size :]
    if prefix + suffix > len(old) or prefix + len(middle) + suffix != size:
        raise BadPatch("patch lengths do not fit the run")
    return b"".join((old[:prefix], middle, old[len(old) - suffix :]))


class Anchors:
    """Where the runs of a new table sit in a base table (an older version held here)."""

    def __init__(self, base: Table) -> None:
        self.base = base
        self.where: dict[bytes, list[int]] = {}
        for i, chunk in enumerate(base.ids):
            self.where.setdefault(chunk, []).append(i)
        self.offsets = base.offsets()
        self.offsets_of = {at: i for i, at in enumerate(self.offsets)}  # chunk index by offset

    def _nearest(self, chunk: bytes, offset: int) -> int | None:
        """The base's copy of ``chunk`` nearest ``offset``: a chunk that repeats (zeros,
        repeated blocks) is taken where the edit left it, not anywhere it occurs."""
        found = self.where.get(chunk)
        if not found:
            return None
        return min(found, key=lambda i: abs(self.offsets[i] - offset))

    def range(self, new: Table, offsets: list[int], first: int, end: int) -> tuple[int, int] | None:
        """The bytes of the base that chunks ``first`` to ``end - 1`` of ``new`` (whose
        chunk offsets are ``offsets``) replaced: between the base's copies of the run's
        neighbours (or the file's ends); None when a neighbour is not in the base (no
        anchor: the run is fetched whole)."""
        base = self.base
        if first == 0:
            start = 0
        elif (left := self._nearest(new.ids[first - 1], offsets[first - 1])) is not None:
            start = self.offsets[left] + base.sizes[left]
        else:
            return None
        size = offsets[end] - offsets[first] if end < len(new.ids) else new.size - offsets[first]
        if end == len(new.ids):
            stop = base.size
        elif start + size < base.size and self.offsets_of.get(start + size) in self.where.get(
            new.ids[end], ()
        ):
            stop = start + size  # the neighbour is where an in-place edit leaves it
        elif (right := self._nearest(new.ids[end], offsets[end])) is not None:
            stop = self.offsets[right]
        else:
            return None
        return (start, stop) if start < stop else None
