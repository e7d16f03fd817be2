"""The trio shell of the provisioning workflow: the state log in and out, timers, power.

Every node keeps the workflow's records as the rack's state holds them (namespace
``provisioning.machines``, one msgpack record per machine; the changefeed feeds a
standby). Only the node holding the rack's lease acts: it turns observations
(a DHCP lease committed, an installer's event) and passed deadlines into records
it commits and power actions it takes through the ``provisioning_power`` hook.
Deadlines are wall-clock times in the records, so a new active resumes them where
the old one left off: after a failover it reloads every record from the state
and its timer fires for whatever is overdue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import msgpack
import trio

from appliance.logs import get_logger
from appliance.state.store import Change, NotWriter, Reset

from .lifecycle import MAX_RECORD, Actions, Record, Workflow

log = get_logger("provisioning")

NS = "provisioning.machines"
MAX_SLEEP = 5.0  # seconds between timer checks at most (a clock step is noticed)


class ProvisioningService:
    def __init__(self, state: Any, flow: Workflow, seeds: list[Record],
                 power: Callable[[Record, str], Any], metrics: Any,
                 writer: Callable[[], bool], clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.state, self.flow, self.seeds = state, flow, seeds
        self.power, self.metrics = power, metrics
        self.writer = writer  # node.fence.ok: does this node hold the rack's lease?
        self.clock = clock
        self.refused = 0  # records in the state that are no records
        self._wake = trio.Event()
        self._queue: list[Actions] = []
        self._active = False

    async def run(self, node=None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._reload()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow)
            nursery.start_soon(self._act)
            task_status.started()

    # -- what the rack's state holds ------------------------------------------------------

    def _reload(self) -> None:
        for name in list(self.flow.machines):
            self.flow.forget(name)
        for name, value in self.state.scan(NS):
            self._load(name, value)

    def _load(self, name: str, value: Any) -> None:
        if value is None:
            self.flow.forget(name)
            return
        try:
            if not isinstance(value, bytes) or len(value) > MAX_RECORD:
                raise ValueError("not a record of at most MAX_RECORD bytes")
            record = Record.from_dict_untrusted(msgpack.unpackb(value))
            if record.name != name:
                raise ValueError(f"record of {record.name!r} under {name!r}")
        except (ValueError, msgpack.UnpackException) as exc:
            self.refused += 1
            log.warning("machine record refused", machine=name, error=str(exc))
            return
        self.flow.load(record)

    async def _follow(self) -> None:
        async for change in self.state.subscribe(NS):
            if self._active:
                continue  # the writer's own records are newer than the feed's
            if isinstance(change, Reset):
                self._reload()
            elif isinstance(change, Change):
                self._load(change.key, change.value)
            self._wake.set()

    # -- acting (the lease holder only) ---------------------------------------------------

    def set_active(self, active: bool) -> None:
        if active and not self._active:
            self._reload()  # what the old active committed, deadlines included
        self._active = active
        self._wake.set()

    @property
    def acting(self) -> bool:
        """Does this node run the workflow (the active)? Others only follow the state."""
        return self._active

    def observe(self, actions: Actions) -> None:
        """What an observation changed (called from hooks, in the trio thread)."""
        if actions.saves or actions.power:
            self._queue.append(actions)
            self._wake.set()

    async def _act(self) -> None:
        while True:
            if self._active and self.writer():
                await self._seed()
                self._queue.append(self.flow.tick(self.clock()))
                while self._queue:
                    await self._apply(self._queue.pop(0))
            deadline = self.flow.next_deadline() if self._active else None
            delay = (
                MAX_SLEEP if deadline is None else min(max(deadline - self.clock(), 0), MAX_SLEEP)
            )
            with trio.move_on_after(delay):
                await self._wake.wait()
            self._wake = trio.Event()

    async def _seed(self) -> None:
        """Configured machines the state does not know yet; and the hardware facts of
        known ones (MACs, power address) as the configuration now gives them: no command
        changes those, so an edited configuration must."""
        for record in self.seeds:
            known = self.flow.machines.get(record.name)
            if known is None:
                self.flow.load(record)
                await self._apply(Actions(saves=[record]))
            elif (known.macs, known.power) != (record.macs, record.power):
                changed = replace(known, macs=record.macs, power=record.power)
                self.flow.load(changed)
                await self._apply(Actions(saves=[changed]))

    async def _apply(self, actions: Actions) -> None:
        try:
            for record in actions.saves:
                await self.state.put(NS, record.name, msgpack.packb(record.to_dict()))
        except NotWriter:
            log.info("not the rack's writer: the new active takes over the workflow")
            return
        self.metrics.count(actions)
        for action in actions.power:
            record = self.flow.machines.get(action.name)
            if record is None:
                continue
            try:
                done = await trio.to_thread.run_sync(self.power, record, action.action)
            except Exception as exc:  # a power plugin's failure: the deadline catches it
                done = False
                log.error("power action failed", machine=action.name, action=action.action,
                          error=f"{type(exc).__name__}: {exc}")  # fmt: skip
            self.metrics.powered(action.action, bool(done))
            if not done:
                log.warning("no power plugin took the action", machine=action.name,
                            action=action.action)  # fmt: skip
