"""Journal frames: ``[u32 length][u32 crc32(payload)][payload]``, and how to
read them back from bytes that may be torn or damaged (pure: no I/O).

A frame is never empty: eight zero bytes would be a valid empty frame, and a
zeroed block must not read as records. The format has no sync marker, so
after a bad frame :func:`scan_untrusted` resumes at the next offset holding a
plausible length (1..max_record, inside the data) whose CRC matches. A wrong
resync needs the 32-bit CRC to match by chance: the expected number over a
damaged region of R bytes is at most R / 2**32 (a 4 KiB sector: 1e-6), and
far less for random bytes, whose length field is rarely plausible (for a
4 KiB max_record about one offset in 2**20 gets as far as the CRC). Its cost
is bounded and reported: one extra record (which the stores' strict decoders
almost surely reject) and at most ``max_record`` bytes after it, inside a
region already reported as damaged.
"""

from __future__ import annotations

import functools
import re
import struct
import zlib
from dataclasses import dataclass

FRAME = struct.Struct("<II")
DEFAULT_MAX_RECORD = 1 << 20


def frame(payload: bytes) -> bytes:
    if not payload:
        raise ValueError("a journal record cannot be empty")
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _frame_end(view: memoryview, offset: int, max_record: int) -> int | None:
    """Where the good frame at ``offset`` ends, or None if there is none there."""
    if offset + FRAME.size > len(view):
        return None
    length, crc = FRAME.unpack_from(view, offset)
    end = offset + FRAME.size + length
    if not 0 < length <= max_record or end > len(view):
        return None
    return end if zlib.crc32(view[offset + FRAME.size : end]) == crc else None


def unframe_untrusted(
    data: bytes | memoryview, max_record: int = DEFAULT_MAX_RECORD
) -> tuple[list[bytes], int]:
    """Split ``data`` into payloads up to the first bad frame; returns them and
    the offset past the last good frame (see :func:`scan_untrusted` for what follows)."""
    view = memoryview(data)
    payloads: list[bytes] = []
    offset = 0
    while (end := _frame_end(view, offset, max_record)) is not None:
        payloads.append(bytes(view[offset + FRAME.size : end]))
        offset = end
    return payloads, offset


@dataclass(frozen=True)
class Scan:
    """What :func:`scan_untrusted` found in a journal's bytes."""

    payloads: list[bytes]
    end: int  # offset past the last good frame; what follows is a torn tail
    size: int
    skipped: list[tuple[int, int]]  # (offset, length) of damage each followed by a good frame
    recovered: int  # payloads after the first damage (all lost before recovery existed)

    @property
    def bytes_lost(self) -> int:
        return sum(length for _, length in self.skipped) + self.size - self.end


def scan_untrusted(data: bytes, max_record: int = DEFAULT_MAX_RECORD) -> Scan:
    """Every good frame of ``data``: after a bad one, the scan resumes at the
    next offset where a good frame starts; a bad frame with none after it is a torn tail."""
    view = memoryview(data)
    payloads: list[bytes] = []
    skipped: list[tuple[int, int]] = []
    first_after_damage = 0
    offset = 0
    while offset < len(view):  # each turn moves ``offset`` forward
        end = _frame_end(view, offset, max_record)
        if end is not None:
            payloads.append(bytes(view[offset + FRAME.size : end]))
            offset = end
            continue
        resync = _resync(view, offset + 1, max_record)
        if resync is None:
            break
        if not skipped:
            first_after_damage = len(payloads)
        skipped.append((offset, resync - offset))
        offset = resync
    recovered = len(payloads) - first_after_damage if skipped else 0
    return Scan(payloads, offset, len(view), skipped, recovered)


def _resync(view: memoryview, start: int, max_record: int) -> int | None:
    pattern, position = _plausible_length(max_record), start
    while (match := pattern.search(view, position)) is not None:
        if _frame_end(view, match.start(), max_record) is not None:
            return match.start()
        position = match.start() + 1
    return None


@functools.lru_cache
def _plausible_length(max_record: int) -> re.Pattern[bytes]:
    """Offsets whose length field is non-zero with its high bytes zero: the
    regex engine skips the rest (zeroed blocks, random bytes) at C speed."""
    width = min(4, max(1, (max_record.bit_length() + 7) // 8))  # bytes a length can use
    nonzero = b"|".join(rb"\x00" * i + rb"[^\x00]" + b"." * (width - 1 - i) for i in range(width))
    return re.compile(rb"(?=(?:" + nonzero + rb")" + rb"\x00" * (4 - width) + rb")", re.DOTALL)
