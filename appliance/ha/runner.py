"""Drives one :class:`~appliance.ha.election.Election` over a transport (trio shell).

The loop waits for a datagram or the machine's deadline, feeds it, then in
this order: persists a new epoch (the acceptor must not answer with an
epoch a crash could make it forget), sends what the machine queued, and
hands each event to ``on_event``. The same runner serves the real node
(UDP, the monotonic clock) and the simulation (an in-memory network,
drifting clocks, paused processes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from appliance.ha.election import AcceptorSet, Election
from appliance.ha.messages import Message
from appliance.ha.proposer import Event

Send = Callable[[str, Message], None]  # (address, message): best effort, never blocks
INBOX = 256  # datagrams waiting for the machine; past it they are dropped, like a full socket


class Clock(Protocol):
    def now(self) -> float:
        """The node's monotonic clock."""

    def to_trio(self, local: float) -> float:
        """When trio's clock reaches this node's ``local`` time."""


class TrioClock:
    """The real node: its clock is trio's."""

    def now(self) -> float:
        return trio.current_time()

    def to_trio(self, local: float) -> float:
        return local


async def _no_pause(step: str = "woke") -> None:
    pass


async def _nowhere(value: Any) -> None:
    pass


class ElectionRunner:
    def __init__(
        self,
        election: Election,
        send: Send,
        *,
        clock: Clock,
        on_event: Callable[[Event], None],
        persist: Callable[[int], Awaitable[None]],
        resume: Callable[..., Awaitable[None]] = _no_pause,
        confirm: Callable[[str], Awaitable[None]] = _nowhere,
        notice: Callable[[str], None] = lambda text: None,
        persist_ineligible: Callable[[frozenset[str]], Awaitable[None]] = _nowhere,
    ) -> None:
        """``resume``: awaited after every wake-up, and with ``"sent"`` between sending and
        applying events; the simulation blocks it while the process is paused (a real
        process simply does not run). ``confirm``: keeps a membership digest every peer
        appliance was seen to share."""
        self.election = election
        self.confirm = confirm
        self.notice = notice
        self.send = send
        self.clock = clock
        self.on_event = on_event
        self.persist = persist
        self.persist_ineligible = persist_ineligible
        self.resume = resume
        self._inbox, self._receive = trio.open_memory_channel[Any](INBOX)
        self.received = 0
        self.dropped = 0

    def deliver(self, sender: str, address: str, message: Message) -> None:
        """A verified message for the machine (from the transport's task)."""
        try:
            self._inbox.send_nowait((sender, address, message))
        except trio.WouldBlock:
            self.dropped += 1

    def poke(self) -> None:
        """The machine was changed from outside (an operator command): re-read its timer."""
        try:
            self._inbox.send_nowait(None)
        except trio.WouldBlock:
            pass  # the queue is full: the loop wakes up anyway

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        self.election.handle_timer(self.clock.now())
        await self.flush()
        while True:
            deadline = self.election.get_timer()
            at = float("inf") if deadline is None else self.clock.to_trio(deadline)
            got = None
            with trio.move_on_at(at) as timer:
                got = await self._receive.receive()
            await self.resume()
            now = self.clock.now()
            if timer.cancelled_caught and deadline is not None:
                # converting between clocks may round a hair short of the deadline
                now = max(now, deadline)
            if deadline is not None and now >= deadline:
                # the deadline came first (e.g. while the process was paused): a lease
                # that ran out is given up before a late answer is looked at
                self.election.handle_timer(now)
            if got is not None:
                self.received += 1
                sender, address, message = got
                self.election.receive(sender, address, message, now)
            deadline = self.election.get_timer()
            if deadline is not None and now >= deadline:
                self.election.handle_timer(now)
            await self.flush()

    async def flush(self) -> None:
        epoch = self.election.epoch_to_persist()
        if epoch is not None:
            await self.persist(epoch)
        ineligible = self.election.ineligible_to_persist()
        if ineligible is not None:
            await self.persist_ineligible(ineligible)
        digest = self.election.confirmed_to_persist()
        if digest is not None:
            await self.confirm(digest)
        while self.election.notices:
            self.notice(self.election.notices.popleft())
        # Events first: a release (demote, maintenance) must find the fence already revoked
        # when it leaves, or the other appliance may hold while this fence still says yes.
        while (event := self.election.next_event()) is not None:
            self.on_event(event)
        await self.resume("sent")  # a step of its own in the simulation
        for address, message in self.election.datagrams_to_send():
            self.send(address, message)


class WitnessRunner:
    """Drives a witness's :class:`~appliance.ha.election.AcceptorSet`: answer each request."""

    def __init__(
        self,
        acceptors: AcceptorSet,
        send: Send,
        *,
        clock: Clock,
        resume: Callable[..., Awaitable[None]] = _no_pause,
    ) -> None:
        self.acceptors = acceptors
        self.send = send
        self.clock = clock
        self.resume = resume
        self._inbox, self._receive = trio.open_memory_channel[Any](INBOX)
        self.received = 0
        self.dropped = 0

    deliver = ElectionRunner.deliver

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for sender, address, message in self._receive:
            await self.resume()
            self.received += 1
            answer = self.acceptors.receive(sender, message, self.clock.now())
            if answer is not None:
                self.send(address, answer)
