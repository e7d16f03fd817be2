"""Kept-alive connections waiting for their next request: one epoll set, one task (trio shell).

A connection's task that has nothing to read parks here (:meth:`Lane.park`)
instead of waiting on its own socket. The lane's one task waits on the epoll
set, and on each wake-up reads every ready socket and hands the bytes to that
connection's ``serve``, a plain function, which answers the common requests at
once (connection.py: ``_serve_fast``). The parked task is not woken for those:
trio's scheduling per wake-up (the wait, the epoll re-arm, the task switch) was
a large part of a small request's cost, and under load one wake-up of the lane
answers many connections. The task is woken, with what it must do itself
(:class:`Handover`), only for what ``serve`` leaves: bytes for h11 (an unusual
head, an incomplete one, a request whose handler awaits), the rest of an answer
that did not fit in the socket, the peer's close or an error.

While the turn lasts the lane asks the set again for what became ready meanwhile:
under load it answers many requests per wake-up.

A parked task keeps everything that ends a connection: its deadline and the
server's cancel scope (displacement, shutdown) cancel the wait, which takes the
socket out of the set first. Each wake-up answers at most ``MAX_READY`` sockets
before the lane waits again (a scheduling point: the accept loop and the other
tasks run between two), and ``serve`` at most a few requests of one socket.
"""

from __future__ import annotations

import errno
import os
import select
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import outcome
import trio

RECEIVE_SIZE = 65536
MAX_READY = 64  # sockets answered per wake-up of the lane (~2 ms of the loop's time)


@dataclass(frozen=True)
class Handover:
    """What a parked connection's task does itself: ``finish`` (the rest of an answer
    begun by ``serve``) or ``request`` (a request ``serve`` parsed and routed, whose
    handler awaits), then ``data`` (the bytes after them); ``eof``: the peer closed."""

    data: bytes = b""
    eof: bool = False
    finish: Callable[[], Awaitable[None]] | None = None
    request: Any = None


Serve = Callable[[bytes], "Handover | None"]  # None: everything answered, stay parked


class Lane:
    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.parked: dict[int, tuple[trio.lowlevel.Task, Serve]] = {}
        self.wakeups = 0  # of the lane's task, for tests and profiles
        self.answered_parked = 0  # reads answered without waking their connection's task

    def close(self) -> None:
        self.epoll.close()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        poll, parked, fd = self.epoll.poll, self.parked, self.epoll.fileno()
        while True:
            await trio.lowlevel.wait_readable(fd)
            self.wakeups += 1
            # Asked again while the turn lasts: what came meanwhile costs no wake-up.
            budget = MAX_READY
            while budget > 0 and (ready := poll(0, budget)):
                budget -= len(ready)
                for conn, _ in ready:
                    entry = parked.get(conn)
                    if entry is not None:
                        self._ready(conn, *entry)

    def _ready(self, fd: int, task: trio.lowlevel.Task, serve: Serve) -> None:
        try:
            data = os.read(fd, RECEIVE_SIZE)
            handover = serve(data) if data else Handover(eof=True)
        except BlockingIOError:
            return  # nothing after all: still parked
        except Exception as exc:  # a reset, or a bug: the connection's task sees it
            self._wake(fd, task, outcome.Error(exc))
            return
        if handover is None:
            self.answered_parked += 1
        else:
            self._wake(fd, task, outcome.Value(handover))

    def _wake(self, fd: int, task: trio.lowlevel.Task, result: outcome.Outcome) -> None:
        self._unpark(fd)
        trio.lowlevel.reschedule(task, result)

    def _unpark(self, fd: int) -> None:
        if self.parked.pop(fd, None) is not None:
            try:
                self.epoll.unregister(fd)
            except OSError as exc:  # closed meanwhile: the kernel dropped it already
                if exc.errno not in (errno.EBADF, errno.ENOENT):
                    raise

    async def park(self, fd: int, serve: Serve) -> Handover:
        """Wait in the lane until ``serve`` hands the connection back (or the wait is
        cancelled: a deadline, a displacement, the server's stop)."""
        self.epoll.register(fd, select.EPOLLIN)
        self.parked[fd] = (trio.lowlevel.current_task(), serve)

        def abort(_: object) -> trio.lowlevel.Abort:
            self._unpark(fd)
            return trio.lowlevel.Abort.SUCCEEDED

        handover: Handover = await trio.lowlevel.wait_task_rescheduled(abort)
        return handover
