"""What a node must do to assemble an image version it lacks (sans-IO).

Given the version's chunk table, what the node already holds (its chunk index:
older versions, other images) and which chunks a resumed sync already wrote,
each chunk is one of:

* **done**: written by an earlier attempt (the completion bitmap says so);
* **zero**: all zero bytes, written locally, never fetched;
* **local**: copied from a file of this node's store (a seed);
* **fetch**: in a *run* of consecutive chunks fetched from a peer with one HTTP
  Range request, at most ``RUN_BYTES`` long so the runs spread over the peers.

:class:`Bitmap` is the completion bitmap itself: one bit per chunk, kept next
to the partial file so an interrupted sync resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .manifest import Table

RUN_BYTES = 8 << 20  # one Range request at most: a peer's share of a large image is many runs


@dataclass(frozen=True)
class Run:
    """Chunks ``first`` to ``end - 1``: bytes ``offset`` to ``offset + size - 1`` of the file."""

    first: int
    end: int
    offset: int
    size: int


@dataclass
class Plan:
    local: list[tuple[int, object]] = field(default_factory=list)  # (chunk, where it is held)
    zero: list[int] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    done: int = 0  # chunks already written

    @property
    def fetch_bytes(self) -> int:
        return sum(run.size for run in self.runs)


def make_plan(
    table: Table,
    held: Callable[[bytes], object | None],
    is_zero: Callable[[bytes, int], bool],
    done: Bitmap,
    run_bytes: int = RUN_BYTES,
) -> Plan:
    """``held(chunk id)``: where this node holds a chunk, or None; ``is_zero(id, size)``."""
    plan = Plan()
    run_first, run_offset, run_size = -1, 0, 0
    offsets = table.offsets()

    def close_run(end: int) -> None:
        nonlocal run_first
        if run_first >= 0:
            plan.runs.append(Run(run_first, end, run_offset, run_size))
            run_first = -1

    for i, (chunk, size) in enumerate(zip(table.ids, table.sizes, strict=True)):
        if done[i]:
            plan.done += 1
        elif is_zero(chunk, size):
            plan.zero.append(i)
        elif (where := held(chunk)) is not None:
            plan.local.append((i, where))
        else:
            if run_first >= 0 and run_size + size > run_bytes:
                close_run(i)
            if run_first < 0:
                run_first, run_offset, run_size = i, offsets[i], 0
            run_size += size
            continue
        close_run(i)
    close_run(len(table.ids))
    return plan


class Bitmap:
    """One bit per chunk: written (1) or not (0)."""

    def __init__(self, count: int, data: bytes = b"") -> None:
        self.count = count
        self.bits = (
            bytearray(data) if len(data) == (count + 7) // 8 else bytearray((count + 7) // 8)
        )

    def __getitem__(self, i: int) -> bool:
        return bool(self.bits[i >> 3] & (1 << (i & 7)))

    def set(self, i: int) -> None:
        self.bits[i >> 3] |= 1 << (i & 7)

    def all(self) -> bool:
        return all(self[i] for i in range(self.count))

    def ones(self) -> int:
        return sum(bin(b).count("1") for b in self.bits)

    def encode(self) -> bytes:
        return bytes(self.bits)
