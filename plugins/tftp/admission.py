"""Who gets a transfer slot: per-source limits and fair sharing of the table (sans-IO).

One client must not take the rack's boot service down. A read request is cheap
to send (20 bytes, any source port, a forged source address) and a transfer is
not (a socket, an open file, DATA retransmitted for seconds), so:

* **Per source address**, at most ``per_source`` transfers that its client has
  not acknowledged yet (the ones a forged or flooding source holds, and the
  only ones that send DATA to an unproven address) run at once. A PXE ROM,
  pxelinux, GRUB or iPXE fetch one file at a time; 4 leaves room for a client
  that gave up and asked again from a new port while its old transfer still
  times out. Requests past it **wait** (up to ``wait_per_source`` per source,
  ``wait_total`` in all, ``max_wait`` seconds each) and start, in arrival
  order, as that source's transfers are acknowledged or end (the shell asks
  again every ``POLL`` while something waits): a host behind NAT or a test rig
  asking for 50 files at once is served as fast as its clients answer, not
  refused. Acknowledged transfers are bounded by the table and the fair share
  below. A waiting request gets nothing until it starts; past the wait lists it
  is refused (``per_source``), and one that waited too long too
  (``wait_expired``).
* **The table is full** (``max_transfers``): the newcomer takes the slot of a
  transfer whose source holds more than it does, preferring one never
  acknowledged (its source may be forged) from the source holding the most,
  oldest first; a transfer that made progress is taken only from a source
  holding at least two more than the newcomer. Otherwise refused (``busy``).
  Spoofing many source addresses therefore cannot lock a real client out.
* **No amplification**: a refusal goes to a source nobody has verified, so it is
  never longer than the request it answers (:func:`refusal`); what waits gets
  nothing. Only a started transfer sends DATA, at most ``per_source`` per source
  at a time, and one never acknowledged ends after two retransmissions
  (transfer.py, ``unverified_retries``).

:class:`Admission` holds only keys, sources, times and the shell's opaque
tickets; the shell asks it, applies the decision and tells it when a transfer
ends. Every operation is bounded by the table and the wait lists.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from .packets import ErrorCode, encode_error

Key = Hashable  # one request: (client address and port, local address)
ERROR_HEADER = 5  # opcode, code, the message's NUL
POLL = 0.02  # seconds between the shell's looks at waiting requests (their sources' ACKs)


@dataclass(frozen=True, slots=True)
class Limits:
    max_transfers: int = 256
    per_source: int = 4
    wait_per_source: int = 64
    wait_total: int = 256
    max_wait: float = 10.0  # seconds a request may wait for its source's turn


@dataclass(frozen=True, slots=True)
class Decision:
    """``admit`` (start it; first stop ``evict`` if set), ``wait``, or ``refuse`` for ``reason``."""

    action: str
    evict: Key | None = None
    reason: str | None = None


ADMIT = Decision("admit")
WAIT = Decision("wait")
REFUSE_PER_SOURCE = Decision("refuse", reason="per_source")
REFUSE_BUSY = Decision("refuse", reason="busy")
MESSAGES = {
    "per_source": "too many transfers from this address",
    "busy": "server busy, try again later",
    "wait_expired": "server busy, try again later",
}


def refusal(reason: str, request_size: int) -> bytes:
    """ERROR 0 for ``reason``, cut to at most ``request_size`` bytes: the source may be
    forged, so it gets no more bytes than it sent (a valid request is >= 9 bytes)."""
    budget = max(request_size - ERROR_HEADER, 0)
    return encode_error(ErrorCode.NOT_DEFINED, MESSAGES[reason][:budget])


@dataclass(slots=True)
class _Waiting:
    source: str
    since: float
    ticket: Any


class Admission:
    """The transfer table's bookkeeping; the shell applies what it decides."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._running: dict[str, dict[Key, float]] = {}  # source -> key -> admitted (in order)
        self._source_of: dict[Key, str] = {}  # every running key
        self._waiting: dict[Key, _Waiting] = {}  # in arrival order
        self._waiting_by_source: Counter[str] = Counter()

    def __contains__(self, key: Key) -> bool:
        return key in self._source_of or key in self._waiting

    @property
    def running(self) -> int:
        return len(self._source_of)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def request(
        self, key: Key, source: str, now: float, ticket: Any, verified: Callable[[Key], bool]
    ) -> Decision:
        """A new request ``key`` from ``source``. ``verified(key)`` says whether a running
        transfer was acknowledged by its client; ``ticket`` comes back when a waiting
        request starts or expires."""
        held = len(self._running.get(source, ()))
        limits = self.limits
        if self._unverified(source, verified) >= limits.per_source:
            if (
                self._waiting_by_source[source] < limits.wait_per_source
                and len(self._waiting) < limits.wait_total
            ):
                self._waiting[key] = _Waiting(source, now, ticket)
                self._waiting_by_source[source] += 1
                return WAIT
            return REFUSE_PER_SOURCE
        if self.running < limits.max_transfers:
            self._add(key, source, now)
            return ADMIT
        victim = self._victim(held, verified)
        if victim is None:
            return REFUSE_BUSY
        self.release(victim)
        self._add(key, source, now)
        return Decision("admit", evict=victim)

    def release(self, key: Key) -> None:
        """``key``'s transfer ended (or was evicted): its slot is free."""
        source = self._source_of.pop(key, None)
        if source is not None:
            keys = self._running[source]
            del keys[key]
            if not keys:
                del self._running[source]

    def take_waiting(
        self, now: float, verified: Callable[[Key], bool]
    ) -> tuple[list[Any], list[Any]]:
        """(tickets to start now, tickets that waited past ``max_wait``), in arrival order."""
        started, expired = [], []
        for key, entry in list(self._waiting.items()):
            if now >= entry.since + self.limits.max_wait:  # get_timer's very expression
                expired.append(self._unwait(key).ticket)
            elif (
                self.running < self.limits.max_transfers
                and self._unverified(entry.source, verified) < self.limits.per_source
            ):
                self._unwait(key)
                self._add(key, entry.source, now)
                started.append(entry.ticket)
        return started, expired

    def get_timer(self, now: float) -> float | None:
        """When to call :meth:`take_waiting` again: the oldest waiting request's expiry,
        or sooner (``POLL``) to see whether its source's transfers were acknowledged
        (None: nothing waits)."""
        for entry in self._waiting.values():
            return min(entry.since + self.limits.max_wait, now + POLL)
        return None

    # -- internals

    def _add(self, key: Key, source: str, now: float) -> None:
        self._running.setdefault(source, {})[key] = now
        self._source_of[key] = source

    def _unwait(self, key: Key) -> _Waiting:
        entry = self._waiting.pop(key)
        self._waiting_by_source[entry.source] -= 1
        if not self._waiting_by_source[entry.source]:
            del self._waiting_by_source[entry.source]
        return entry

    def _unverified(self, source: str, verified: Callable[[Key], bool]) -> int:
        return sum(1 for key in self._running.get(source, ()) if not verified(key))

    def _victim(self, held: int, verified: Callable[[Key], bool]) -> Key | None:
        """A running transfer to give up for a newcomer whose source holds ``held``."""
        richer = sorted(
            (keys for keys in self._running.values() if len(keys) > held), key=len, reverse=True
        )
        for keys in richer:
            for key in keys:  # oldest first
                if not verified(key):
                    return key
        if richer and len(richer[0]) > held + 1:
            return next(iter(richer[0]))
        return None
