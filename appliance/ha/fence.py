"""The fencing guard every plugin consults before an outward effect (sans-IO).

``node.fence.ok()`` is true only while this node holds the rack's lease:
``now < valid_until`` on the node's clock (CLOCK_BOOTTIME, appliance/clock.py),
read at the moment of the check. The election moves ``valid_until`` forward on
each renewal; when the lease is lost or released it drops to ``-inf`` *before*
any plugin hears of the role change. So a process paused past its lease
(SIGSTOP, a swap storm, a suspend) that wakes up and finds a reply ready to
send is told no, even before the election's own task has run. The clock is
read through the clock object, so any thread may ask.

A standalone node (no ``[ha]`` peers) holds an endless lease while active.
"""

from __future__ import annotations

import math
from collections.abc import Callable

NEVER = -math.inf
FOREVER = math.inf


class Fence:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.valid_until = NEVER
        self.epoch = 0
        self.vip: str | None = None  # the rack's virtual IP, without prefix
        self.refused = 0  # checks answered no while the node believed it was active

    def grant(self, valid_until: float, epoch: int = 0) -> None:
        self.valid_until = valid_until
        self.epoch = epoch

    def revoke(self) -> None:
        self.valid_until = NEVER

    def ok(self) -> bool:
        """May this node act for the rack now (answer dynamic DHCP, speak from the VIP)?"""
        if self.clock() < self.valid_until:
            return True
        self.refused += 1
        return False

    def guard_for(self, address: str) -> Callable[[], bool] | None:
        """What to ask before each effect from ``address``: :meth:`ok` for the rack's VIP,
        None for the node's own addresses (they speak for the node, not the rack)."""
        return self.ok if address == self.vip else None
