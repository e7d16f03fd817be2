"""The invariants, checked at every grant, step-down and outward effect (in true time).

* at most one node holds a valid lease at any instant;
* epochs only rise: each new holder's epoch is above every epoch granted
  before, and a holder renews with its own;
* no outward effect after validity (an effect is a holder's act through the fence);
* a node back from a pause past its lease steps down before doing anything else;
* an acceptor accepts a round's proposal at most once per life (an adversary replays
  captured frames throughout).

A holder's validity is recorded in true time, converted from its own clock;
it stays recorded when the process dies (the acceptors' grants still run).
"""

from __future__ import annotations

from dataclasses import dataclass

import trio


@dataclass
class Holding:
    epoch: int
    until: float  # true time


class Violation(AssertionError):
    pass


class Checker:
    def __init__(self, world) -> None:
        self.world = world
        self.holdings: dict[str, Holding] = {}
        self.max_epoch = 0
        self.grants = 0
        self.acquisitions = 0
        self.effects = 0
        self.failovers = 0  # acquisitions by another node than the last holder
        self.stale_resumes = 0  # holders resumed after a pause past their lease
        self.last_holder = ""
        self.violations: list[str] = []
        self._accepted: set[tuple[str, int, str, int]] = set()  # acceptor, life, proposer, round

    def fail(self, text: str) -> None:
        line = f"t={trio.current_time():.6f} {text}"
        self.world.note(f"VIOLATION {text}")
        self.violations.append(line)

    def granted(self, process, epoch: int, valid_until: float, renewal: bool) -> None:
        now = trio.current_time()
        until = process.clock.to_trio(valid_until)
        self.grants += 1
        for name, other in self.holdings.items():
            if name != process.name and other.until > now:
                self.fail(
                    f"two holders: {process.name} (epoch {epoch}) while {name} (epoch "
                    f"{other.epoch}) is valid for {other.until - now:.6f} s more"
                )
        mine = self.holdings.get(process.name)
        if renewal:
            if mine is None or mine.epoch != epoch:
                self.fail(f"{process.name} renewed epoch {epoch}, it held {mine}")
        else:
            self.acquisitions += 1
            if self.last_holder and self.last_holder != process.name:
                self.failovers += 1
            self.last_holder = process.name
            if epoch <= self.max_epoch:
                self.fail(f"epoch did not rise: {process.name} took {epoch} after {self.max_epoch}")
        if until <= now:
            self.fail(f"{process.name} granted a lease already over")
        self.max_epoch = max(self.max_epoch, epoch)
        self.holdings[process.name] = Holding(epoch, until)

    def accepted(self, process, proposer: str, req: int) -> None:
        """An acceptor accepts a round's proposal once per life: a replay is not a vote."""
        key = (process.name, process.incarnation, proposer, req)
        if key in self._accepted:
            self.fail(f"{process.name} accepted {proposer}'s proposal of round {req} twice")
        self._accepted.add(key)

    def lost(self, process) -> None:
        mine = self.holdings.get(process.name)
        if mine is not None:
            mine.until = min(mine.until, trio.current_time())

    def effect(self, process) -> None:
        now = trio.current_time()
        self.effects += 1
        mine = self.holdings.get(process.name)
        if mine is None or mine.until <= now:
            self.fail(f"outward effect by {process.name} after its validity ({mine})")
        for name, other in self.holdings.items():
            if name != process.name and other.until > now:
                self.fail(f"outward effect by {process.name} while {name} is valid")

    async def stepped_down_after_pause(self, process) -> None:
        """Right after a resume, once every task has had its turn: not active on an old lease."""
        resumed = trio.current_time()
        mine = self.holdings.get(process.name)
        stale = mine is not None and mine.until <= resumed and process.active
        self.stale_resumes += stale
        await self.world.settle()
        if stale and process.alive and process.active:
            current = self.holdings.get(process.name)
            if current is mine or current.until <= trio.current_time():
                self.fail(f"{process.name} still active after a pause past its lease")
