"""Choosing the offered rates to try (pure logic, no I/O).

Screening runs each rate once, in one of two ways:

* a **sweep** of given rates, ascending, stopping at the first that loses >= 1 %;
* a **search**: start low and double while the rate is sustained, then bisect
  between the highest sustained and the lowest failing rate until the gap is
  within ``precision`` of the failing rate. Bounded by ``max_steps``.

The confirmation (N fresh repeats at the best rate, stepping down by 10 % when
their median loss is >= 1 %) is driven by the caller with :func:`confirm_candidates`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def nice(rate: float) -> int:
    """Round to two significant digits (9,637 -> 9,600; 287 -> 290; 43 -> 43)."""
    if rate < 100:
        return max(1, round(rate))
    step = 10 ** (int(math.floor(math.log10(rate))) - 1)
    return int(round(rate / step) * step)


@dataclass
class RateSearch:
    start: int = 200
    min_rate: int = 10  # a server failing this low has no rate worth bisecting for
    max_rate: int = 100_000
    precision: float = 0.05  # stop bisecting when hi - lo <= precision * hi
    max_steps: int = 14
    sweep: list[int] | None = None  # explicit rates: no doubling, no bisecting
    tried: dict[int, bool] = field(default_factory=dict)  # rate -> sustained

    def record(self, rate: int, sustained: bool) -> None:
        self.tried[rate] = sustained

    @property
    def best(self) -> int | None:
        ok = [r for r, passed in self.tried.items() if passed]
        return max(ok) if ok else None

    @property
    def lowest_failure(self) -> int | None:
        bad = [r for r, passed in self.tried.items() if not passed]
        return min(bad) if bad else None

    def next_rate(self) -> int | None:
        """The next rate to screen, or None when screening is done."""
        if len(self.tried) >= self.max_steps:
            return None
        if self.sweep is not None:
            if self.lowest_failure is not None:
                return None
            todo = [r for r in sorted(self.sweep) if r not in self.tried]
            return todo[0] if todo else None
        lo, hi = self.best or 0, self.lowest_failure
        if hi is None:  # still doubling
            if not self.tried:
                return self.start
            if lo >= self.max_rate:
                return None
            return min(lo * 2, self.max_rate)
        if hi <= lo:  # noisy: a higher rate passed than one that failed; trust the failure
            lo = max((r for r, ok in self.tried.items() if ok and r < hi), default=0)
        if hi - lo <= max(self.precision * hi, 1):
            return None
        mid = nice((lo + hi) / 2)
        if lo == 0 and mid < self.min_rate:
            return None
        if not lo < mid < hi:
            mid = (lo + hi) // 2
        if not lo < mid < hi or mid in self.tried:
            return None
        return mid

    def sustained_below_failure(self) -> list[int]:
        """Rates that passed screening, highest first, below the lowest failure."""
        hi = self.lowest_failure
        return sorted(
            (r for r, ok in self.tried.items() if ok and (hi is None or r < hi)), reverse=True
        )


def confirm_candidates(search: RateSearch, max_candidates: int = 3) -> list[int]:
    """Rates to confirm with N repeats, in order, until one holds.

    The best screened rate first, then steps of 10 % below it (a single screening
    run can be lucky; the step-down stays close to where the ceiling really is).
    """
    best = search.best
    if best is None:
        return []
    out: list[int] = []
    for factor in (1.0, 0.9, 0.8, 0.7, 0.6):
        rate = best if factor == 1.0 else nice(best * factor)
        if rate >= 1 and rate not in out:
            out.append(rate)
        if len(out) >= max_candidates:
            break
    return out


def median(values: list[float]) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
