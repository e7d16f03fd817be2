"""Which connections the HTTP server holds: a cap per source, fair admission (sans-IO).

A booting machine opens a handful of connections (iPXE and UEFI HTTP boot one
at a time, an installer's package manager a few in parallel). A client that
opens hundreds, or leaves them half-written (slowloris), must not take the
rack's boot service from the others. Two rules, decided here with an explicit
``now`` and applied by server.py:

* **Per source.** A source (client IP) holding ``max_per_source`` connections
  gets no more: refusal ``per-source``.
* **Full table.** With ``max_connections`` open, a newcomer displaces a
  *waiting* connection (its request head not complete yet, or kept alive idle
  between requests) of the source holding the most connections, if that source
  holds more than the newcomer's does; the oldest wait goes first. A connection
  whose request is being answered (a download, however slow) is never
  displaced. No such victim: refusal ``full``.

Why this policy: a source can only lose connections to one holding fewer, so
the heaviest holder pays for the flood it makes, and the table tends towards
equal shares (max-min fairness) without a tuning knob. The oldest waiting
connection is the one least likely to be a live client (a real client's head
arrives in one segment, milliseconds after its connect; an idle kept-alive
connection may be closed by a server at any time, RFC 9112 9.8). When every
source holds one connection, a newcomer still gets in by closing the oldest
wait, as nginx reuses its oldest idle connections when it runs out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HEAD, IDLE, BUSY = "head", "idle", "busy"
PHASES = (HEAD, IDLE, BUSY)
REFUSALS = ("per-source", "full")


@dataclass(frozen=True)
class Admitted:
    conn: int
    evict: int | None = None  # the connection to close to make room, if any
    evicted_phase: str | None = None  # HEAD or IDLE: what the closed one was waiting for
    evicted_source: str | None = None  # whose connection it was


@dataclass(frozen=True)
class Refused:
    reason: str  # one of REFUSALS


@dataclass
class _Source:
    held: int = 0
    # conn -> when its wait began; insertion order is age order (``now`` never goes back)
    waiting: dict[int, float] = field(default_factory=dict)


class Admission:
    def __init__(self, max_connections: int, max_per_source: int) -> None:
        if max_connections < 1 or max_per_source < 1:
            raise ValueError("max_connections and max_per_source must be at least 1")
        self.max_connections = max_connections
        self.max_per_source = max_per_source
        self._sources: dict[str, _Source] = {}
        self._conns: dict[int, tuple[str, str]] = {}  # conn -> (source, phase)
        self._next = 0

    def __len__(self) -> int:
        return len(self._conns)

    def held_by(self, source: str) -> int:
        entry = self._sources.get(source)
        return 0 if entry is None else entry.held

    def in_phase(self, phase: str) -> int:
        return sum(1 for _, held in self._conns.values() if held == phase)

    def phase(self, conn: int) -> str | None:
        """The connection's phase, ``None`` once released or displaced."""
        held = self._conns.get(conn)
        return None if held is None else held[1]

    def admit(self, source: str, now: float) -> Admitted | Refused:
        """A new connection from ``source``: admitted (waiting for its head since ``now``,
        perhaps displacing another, which is forgotten at once) or refused."""
        own = self.held_by(source)
        if own >= self.max_per_source:
            return Refused("per-source")
        victim = None
        if len(self._conns) >= self.max_connections:
            victim = self._victim(own)
            if victim is None:
                return Refused("full")
        evicted_source, evicted_phase = (None, None) if victim is None else self._conns[victim]
        if victim is not None:
            self.release(victim)
        conn, self._next = self._next, self._next + 1
        self._sources.setdefault(source, _Source()).held += 1
        self._conns[conn] = (source, BUSY)
        self.mark(conn, HEAD, now)
        return Admitted(conn, victim, evicted_phase, evicted_source)

    def mark(self, conn: int, phase: str, now: float) -> None:
        """The connection now waits for a head (HEAD), idles (IDLE) or is served (BUSY).
        Unknown connections (displaced, released) are ignored."""
        held = self._conns.get(conn)
        if held is None:
            return
        source = held[0]
        waiting = self._sources[source].waiting
        waiting.pop(conn, None)
        if phase != BUSY:
            waiting[conn] = now  # at the end: the youngest wait of its source
        self._conns[conn] = (source, phase)

    def release(self, conn: int) -> None:
        """The connection is closed. Releasing twice, or a displaced one, is harmless."""
        held = self._conns.pop(conn, None)
        if held is None:
            return
        entry = self._sources[held[0]]
        entry.held -= 1
        entry.waiting.pop(conn, None)
        if entry.held == 0:
            del self._sources[held[0]]

    def _victim(self, newcomer_holds: int) -> int | None:
        """The oldest waiting connection of the heaviest source holding more than the
        newcomer's; among equally heavy sources, the one with the oldest wait."""
        best: tuple[int, float, int] | None = None  # (-held, since, conn): smallest wins
        for entry in self._sources.values():
            if entry.held <= newcomer_holds or not entry.waiting:
                continue
            conn, since = next(iter(entry.waiting.items()))
            candidate = (-entry.held, since, conn)
            if best is None or candidate < best:
                best = candidate
        return None if best is None else best[2]
