"""The node's clock: CLOCK_BOOTTIME, which keeps counting while the machine is suspended.

trio's default clock is CLOCK_MONOTONIC, which stops during a suspend (and so
does everything built on it). The fence compares ``now`` with the end of the
rack's lease: a holder suspended for ten seconds must find on waking that ten
seconds went by, not none. ``rackboot run`` and ``rackboot witness`` run trio on
:class:`BoottimeClock`, so every deadline, timer and fence check of a node reads
CLOCK_BOOTTIME. What no guest clock can see (a hypervisor that hides a pause
from the guest) is stated in docs/ha.md.

``current_time`` is plain arithmetic on a system clock: the fence may be asked
from another thread (TFTP's pump) through ``Clock.current_time`` itself, never
through ``trio.current_time``, which needs the trio thread.
"""

from __future__ import annotations

import time

import trio


def boottime() -> float:
    """Seconds of CLOCK_BOOTTIME: the same value in every process of the machine."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class BoottimeClock(trio.abc.Clock):
    """A trio clock on CLOCK_BOOTTIME (no offset: values can be shared with other processes)."""

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def deadline_to_sleep_time(self, deadline: float) -> float:
        return deadline - time.clock_gettime(time.CLOCK_BOOTTIME)
