"""The data path of the TFTP shell: one thread, one epoll loop, every running transfer.

Why a thread: a trio task per transfer paid one task wake-up per ACK (epoll in
the run loop, rescheduling, a cancel scope), about 60 µs of CPU per block,
against 20-25 µs for a plain blocking loop (bench/README.md, bench.tftp). Here
one loop waits on every transfer socket at once, reads the one ACK each ready
socket holds, feeds it to that transfer's sans-IO machine and sends what the
machine answers: under load one wake-up serves many transfers. The ACK a
lock-step machine expects (``fast_ack``) is answered with the DATA it prepared
beforehand (``fast_data``), then ``ack_next`` (transfer.py: the fast path).

The trio side (``server.py``) admits a request, opens the file, negotiates and
builds the :class:`~plugins.tftp.transfer.ReadTransfer`, then hands a
:class:`Job` over with :meth:`Pump.submit`; from then on the pump thread alone
touches the job, until it hands it back through ``post`` (trio's
``run_sync_soon``): ``finished`` once the machine is done (or the job crashed),
``refill`` when its file needs a read that could wait for the disk. Nothing in
here blocks except ``epoll`` itself: sockets are non-blocking, a full send
buffer parks the rest of a window until the socket is writable, and file bytes
are either buffered already or read with ``RWF_NOWAIT`` (page cache only).

The fence: a transfer served from the rack's VIP carries ``guard`` (the node's
``fence.ok``, a clock read and a compare), asked before its machine is pulled
for the next window (``_step``), before a lock-step block goes out on the fast
path and before a parked window is flushed. When it says no the job stops:
nothing more leaves the VIP, not even an ERROR (that too would speak for the
rack), and it is handed back as ``fenced``. A transfer from the node's own
address has no guard and pays one ``is None`` test.

Eviction: admission (trio) may give a running transfer's slot to another
client; :meth:`Pump.evict` hands the job back through the inbox, and the pump
ends it with ``ReadTransfer.evict`` (ERROR 0 only to a client that acknowledged
something) and hands it back once, like any ending job (``handed_back``).

Timers: one heap of ``(deadline, sequence number, job)``. A job's entry is pushed only when
its machine's timer is earlier than the one armed (normally each send moves the
timer later, so a steady transfer costs one heap entry per timeout period); an
entry that is no longer the job's armed deadline is dropped when popped, and
``handle_timer`` ignores a deadline not yet due.
"""

from __future__ import annotations

import heapq
import itertools
import os
import select
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from appliance.logs import get_logger

from .source import Source
from .transfer import ReadTransfer

log = get_logger("tftp")

ACK_BUFFER = 1024  # what a transfer socket reads: ACKs are 4 bytes, ERRORs short
_IN = select.EPOLLIN
_IN_OUT = select.EPOLLIN | select.EPOLLOUT
_NEVER = float("inf")
_SOL_UDP = 17
_UDP_SEGMENT = 103  # Linux >= 4.18 (socket.UDP_SEGMENT is missing from Python 3.11)
_GSO_SEGMENTS = 64  # the kernel's UDP_MAX_SEGMENTS
SPIN_AMONG = 16  # more transfers than this at once: no busy poll (one source holds 4)
_GSO_BYTES = 65_000  # one GSO send is one IP datagram before it is cut: < 64 KiB

Address = tuple[str, int]
Post = Callable[..., Any]  # trio's TrioToken.run_sync_soon: call fn(*args) in the trio thread
Guard = Callable[[], bool]  # may this job still send? (node.fence.ok; any thread may ask)


class Job:
    """One running transfer: its socket, machine and source, owned by one thread at a time."""

    __slots__ = (
        "sock", "fd", "peer", "machine", "source", "need", "info", "started", "ended",
        "armed", "last_batch", "gso", "backlog", "parked", "waiting", "refilled", "crash",
        "closed", "guard", "fenced", "evicted", "handed_back",
    )  # fmt: skip

    def __init__(
        self, sock, peer: Address, machine: ReadTransfer, source: Source, need: int, info: Any,
        started: float, guard: Guard | None = None,
    ) -> None:  # fmt: skip
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.machine = machine
        self.source = source
        self.need = need  # bytes the machine may read for one window
        self.info = info  # the server's own record of the request (for its log line)
        self.started = started
        self.ended = started
        self.armed = _NEVER  # the deadline this job has in the heap
        self.last_batch: list[bytes] = []  # holds our ERROR when we ended the transfer with one
        self.backlog: deque[bytes] = deque()  # datagrams waiting for room in the send buffer
        self.parked = 0  # times the send buffer was full (the server adds them to its stats)
        self.waiting = False  # a refill is out (trio reads the file); the machine is not pulled
        self.refilled = False  # the refill is back: pull once whatever the buffer holds
        self.crash: BaseException | None = None
        self.gso = True  # send a window with one system call until the kernel refuses
        self.closed = False
        self.guard = guard  # fence.ok for a transfer from the VIP; None: the node's own address
        self.fenced = False  # stopped because the fence closed: nothing more was sent
        self.evicted = False  # admission gave its slot to another client (set by trio)
        self.handed_back = False  # posted to ``finished``: the pump no longer drives it


class Pump:
    """The loop. :meth:`run` is the thread's body; the other public methods are
    called from the trio thread and only queue work and wake the loop."""

    def __init__(
        self, post: Post, finished: Callable[[Job], None], refill: Callable[[Job], None], *,
        busy_poll: float = 0.0,
    ) -> None:  # fmt: skip
        self._post = post
        self._finished = finished
        self._refill = refill
        self._busy_poll = busy_poll
        self._epoll = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake_fd, _IN)
        self._inbox: deque[Job] = deque()  # new jobs and refilled ones, from trio
        self._jobs: dict[int, Job] = {}  # by socket fd
        self._timers: list[tuple[float, int, Job]] = []
        self._seq = itertools.count()
        self._stopping = False

    # -- from the trio thread ----------------------------------------------

    def submit(self, job: Job) -> None:
        """Start driving ``job`` (its first datagrams go out from the pump thread)."""
        self._inbox.append(job)
        self._wake()

    def resume(self, job: Job) -> None:
        """``job``'s refill is done (successfully or not: the source knows)."""
        job.refilled = True
        self._inbox.append(job)
        self._wake()

    def evict(self, job: Job) -> None:
        """End ``job`` for admission (``job.evicted`` is set): ERROR 0 to a verified
        client, nothing to an unverified source (``ReadTransfer.evict``)."""
        job.evicted = True
        self._inbox.append(job)
        self._wake()

    def stop(self) -> None:
        """Make :meth:`run` return soon; the jobs it held stay for the caller to close."""
        self._stopping = True
        self._wake()

    def close(self) -> None:
        """After :meth:`run` returned: release the loop's own descriptors."""
        self._epoll.close()
        os.close(self._wake_fd)

    def _wake(self) -> None:
        try:
            os.eventfd_write(self._wake_fd, 1)
        except BlockingIOError:
            pass  # the counter is saturated: the loop is awake anyway

    # -- the thread ----------------------------------------------------------

    def run(self) -> None:
        thread = threading.current_thread()
        name, thread.name = thread.name, "tftp-pump"  # in stack dumps and py-spy
        try:
            self._loop()
        finally:
            thread.name = name  # the thread goes back to trio's cache

    def _loop(self) -> None:
        clock, poll, jobs, heap = time.monotonic, self._epoll.poll, self._jobs, self._timers
        while not self._stopping:
            now = clock()
            wait = max(heap[0][0] - now, 0.0) if heap else -1.0
            if self._busy_poll and not self._inbox:
                job = _lone_acknowledged(jobs)
                if job is not None and self._spin(
                    job, self._busy_poll if wait < 0 else min(self._busy_poll, wait)
                ):
                    if len(jobs) == 1:
                        continue
                    wait = 0.0  # the others' sockets were not watched meanwhile: look now
            events = poll(wait)
            now = clock()
            for fd, mask in events:
                job = jobs.get(fd)
                if job is None:
                    if fd == self._wake_fd:
                        self._take_inbox(now)
                    continue
                try:
                    if mask & select.EPOLLOUT and not self._flush(job):
                        continue  # the fence stopped it
                    if mask & ~select.EPOLLOUT and self._receive(job, now):
                        continue  # the lock-step fast path sent the next block
                    self._step(job, now)
                except Exception as exc:  # one transfer's bug must not stop the others
                    self._crash(job, exc)
            while heap and heap[0][0] <= now:
                deadline, _, job = heapq.heappop(heap)
                if job.armed != deadline or jobs.get(job.fd) is not job:
                    continue  # superseded by an earlier deadline, or finished
                job.armed = _NEVER
                try:
                    job.machine.handle_timer(now)
                    self._step(job, now)
                except Exception as exc:
                    self._crash(job, exc)

    def _spin(self, job: Job, seconds: float) -> bool:
        """Poll the lone (acknowledged) transfer's socket without sleeping for up to ``seconds``; True
        when a datagram came and was handled. Its ACK is one round trip away, a vCPU
        that halts meanwhile is slow to wake, and reading the socket directly spares
        the epoll call between the ACK and the next DATA."""
        if job.backlog:
            return False  # the send buffer is full: only epoll says when it drains
        recv, clock, end = job.sock.recv, time.perf_counter, time.perf_counter() + seconds
        while clock() < end:
            try:
                data = recv(ACK_BUFFER)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return False  # e.g. an ICMP error: epoll and the timer take over
            now = time.monotonic()
            try:
                if not self._handle(job, data, now):
                    self._step(job, now)
            except Exception as exc:
                self._crash(job, exc)
            return True
        return False

    def _take_inbox(self, now: float) -> None:
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:
            pass
        while self._inbox:
            job = self._inbox.popleft()
            if job.handed_back:
                continue  # it ended before an eviction (or its refill) reached us
            try:
                if job.fd not in self._jobs:
                    self._epoll.register(job.fd, _IN)
                    self._jobs[job.fd] = job
                job.waiting = False
                if job.evicted:
                    job.backlog.clear()
                    job.machine.evict()  # _step sends its final ERROR, if any, and finishes
                self._step(job, now)
            except Exception as exc:
                self._crash(job, exc)

    def _receive(self, job: Job, now: float) -> bool:
        """Read one datagram and feed it to the machine; True when the lock-step fast
        path already sent the answer (the job needs no :meth:`_step`)."""
        # One datagram per wake-up: epoll is level-triggered, so a second one queued
        # comes back with the next poll, and lock-step never pays for an empty read.
        try:
            data = job.sock.recv(ACK_BUFFER)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return False  # e.g. an ICMP error queued on the socket: the timer covers it
        return self._handle(job, data, now)

    def _handle(self, job: Job, data: bytes, now: float) -> bool:
        """One datagram from the client; True when the fast path answered it."""
        machine = job.machine
        if (
            data == machine.fast_ack
            and not job.waiting
            and not job.backlog
            and not job.source.short_of(job.need)
        ):
            if job.guard is not None and not job.guard():
                self._fence(job, now)
                return True
            try:
                job.sock.send(machine.fast_data)
            except BlockingIOError:
                self._park(job, [machine.fast_data])
            except OSError as exc:
                _send_failed(job, exc)
            machine.ack_next(now)  # the bookkeeping, and the next block read ahead
            return True
        machine.receive_datagram(data, now)
        return False

    def _step(self, job: Job, now: float) -> None:
        """Pull what the machine has to send, send it, then finish or re-arm the timer."""
        if job.waiting or job.backlog:
            return  # stepped again once the refill is back or the send buffer has drained
        machine, source = job.machine, job.source
        if (
            job.guard is not None
            and not job.guard()
            # a job the client ended (complete, aborted) has nothing left to send
            and (not machine.done or machine.datagrams_to_send(now))
        ):
            # The lease is gone: nothing more leaves the VIP, not even a final ERROR.
            # Stopped before the machine is pulled: its counters hold what went out.
            self._fence(job, now)
            return
        if machine.done:
            pass  # nothing to read: only a final ERROR may be left to send
        elif job.refilled:
            job.refilled = False  # whatever the refill got: a failed read fails the transfer
        elif source.short_of(job.need) and not source.fill_nowait(job.need):
            job.waiting = True
            self._post(self._refill, job)
            return
        batch = machine.datagrams_to_send(now)
        if batch:
            job.last_batch = batch
            self._send(job, batch)
        if machine.done:
            if not job.backlog:  # else the final ERROR goes out first (stepped after _flush)
                self._finish(job, now)
            return
        deadline = machine.get_timer()
        if deadline is not None and deadline < job.armed:
            job.armed = deadline
            heapq.heappush(self._timers, (deadline, next(self._seq), job))

    def _send(self, job: Job, batch: list[bytes]) -> None:
        sock = job.sock
        i, count = 0, len(batch)
        while i < count:
            group = _gso_group(batch, i) if job.gso and count - i > 1 else 1
            try:
                if group > 1:
                    # A window in one system call: the kernel cuts it into datagrams
                    # of the first one's size (UDP GSO); only the last may be shorter.
                    segment = struct.pack("=H", len(batch[i]))
                    sock.sendmsg([b"".join(batch[i : i + group])],
                                 [(_SOL_UDP, _UDP_SEGMENT, segment)])  # fmt: skip
                else:
                    sock.send(batch[i])
            except BlockingIOError:
                self._park(job, batch[i:])  # the send buffer is full (a large window)
                return
            except OSError as exc:
                if group > 1:
                    job.gso = False  # not here (no kernel support, a segment over the MTU)
                    continue  # the same datagrams, one by one
                _send_failed(job, exc)
            i += group

    def _park(self, job: Job, datagrams: list[bytes]) -> None:
        """Keep ``datagrams`` until the socket is writable (EPOLLOUT), in order."""
        job.backlog.extend(datagrams)
        job.parked += 1
        self._epoll.modify(job.fd, _IN_OUT)

    def _flush(self, job: Job) -> bool:
        """Send the parked datagrams that fit; False when the fence stopped the job."""
        if job.guard is not None and not job.guard():
            self._fence(job, time.monotonic())
            return False
        backlog = job.backlog
        while backlog:
            try:
                job.sock.send(backlog[0])
            except BlockingIOError:
                return True
            except OSError as exc:
                _send_failed(job, exc)
            backlog.popleft()
        self._epoll.modify(job.fd, _IN)
        return True

    def _fence(self, job: Job, now: float) -> None:
        """The lease is gone: stop ``job`` without another datagram (no ERROR either)."""
        job.fenced = True
        job.backlog.clear()
        self._finish(job, now)

    def _crash(self, job: Job, exc: BaseException) -> None:
        job.crash = exc
        self._finish(job, time.monotonic())

    def _finish(self, job: Job, now: float) -> None:
        if job.handed_back:
            return
        job.handed_back = True
        if self._jobs.get(job.fd) is job:
            del self._jobs[job.fd]
            self._epoll.unregister(job.fd)
        job.armed = _NEVER
        job.ended = now
        self._post(self._finished, job)


def _gso_group(batch: list[bytes], i: int) -> int:
    """How many datagrams from ``batch[i]`` on one UDP GSO send can carry: same size as
    the first (the last may be shorter), at most _GSO_SEGMENTS and _GSO_BYTES."""
    size = len(batch[i])
    limit = min(len(batch), i + _GSO_SEGMENTS, i + _GSO_BYTES // size)
    j = i + 1
    while j < limit and len(batch[j]) == size:
        j += 1
    if j < limit and len(batch[j]) < size:
        j += 1  # the short final block ends the group
    return j - i


def _lone_acknowledged(jobs: dict[int, Job]) -> Job | None:
    """The transfer to busy-poll: the only one, or the only one among a few whose
    client acknowledged anything (a flood's never-acknowledged transfers only wait
    for their timers, and must not cost the real client its fast path)."""
    if len(jobs) == 1:
        return next(iter(jobs.values()))
    if len(jobs) > SPIN_AMONG:
        return None
    found = None
    for job in jobs.values():
        if job.machine.verified:
            if found is not None:
                return None
            found = job
    return found


def _send_failed(job: Job, exc: OSError) -> None:
    # E.g. ECONNREFUSED: the client's port is gone (ICMP). The timer ends the transfer.
    log.debug("send failed", client=f"{job.peer[0]}:{job.peer[1]}", error=str(exc))
