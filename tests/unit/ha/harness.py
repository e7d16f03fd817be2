"""A tiny explicit-time network for the election's unit tests (no trio, no sockets).

Nodes are :class:`Election` objects named by their address; witnesses are
:class:`AcceptorSet` objects. Messages are delivered after ``delay`` seconds
unless a link is cut; timers fire in time order. Every node reads the same
clock here: drift, loss and pauses are the simulation's business.
"""

from __future__ import annotations

import heapq
import itertools
import random

from appliance.ha.election import AcceptorSet, Election
from appliance.ha.proposer import Acquired, Lost, Renewed
from appliance.ha.schema import Timing


class Net:
    def __init__(self, timing: Timing | None = None, delay: float = 0.001) -> None:
        self.timing = timing or Timing()
        self.delay = delay
        self.now = 0.0
        self.nodes: dict[str, Election] = {}
        self.witnesses: dict[str, AcceptorSet] = {}
        self.queue: list = []
        self.seq = itertools.count()
        self.cut: set[tuple[str, str]] = set()  # (from, to) pairs that lose everything
        self.dead: set[str] = set()
        self.log: list[tuple[float, str, object]] = []  # (time, node, event)
        self.disk: dict[str, int] = {}
        self.confirmed: dict[str, str] = {}  # name -> membership digest on its disk

    def add_node(self, name: str, peers, witnesses, **kw) -> Election:
        kw.setdefault("known_epoch", self.disk.get(name, 0))
        kw.setdefault("confirmed", self.confirmed.get(name, ""))
        node = Election(
            name, "rack1", self.timing, peers=list(peers), witnesses=list(witnesses),
            now=self.now, incarnation=len(self.log), rng=random.Random(name), **kw,
        )  # fmt: skip
        self.nodes[name] = node
        self.dead.discard(name)
        self._flush(name)
        return node

    def add_witness(self, name: str) -> AcceptorSet:
        self.witnesses[name] = AcceptorSet(self.timing.lease, self.now)
        self.dead.discard(name)
        return self.witnesses[name]

    def rack(self, *names: str, witness: str = "w") -> None:
        """Appliances ``names`` plus one witness, all started now."""
        self.add_witness(witness)
        for name in names:
            self.add_node(name, [n for n in names if n != name], [witness])

    def kill(self, name: str) -> None:
        self.dead.add(name)

    def partition(self, a: str, b: str) -> None:
        self.cut |= {(a, b), (b, a)}

    def heal(self) -> None:
        self.cut.clear()

    # -- running ------------------------------------------------------------------

    def run_until(self, t: float) -> None:
        while True:
            timer = self._next_timer()
            due = self.queue[0][0] if self.queue else float("inf")
            at = min(timer[0], due) if timer else due
            if at > t:
                break
            self.now = max(self.now, at)
            if timer and timer[0] <= due:
                node = self.nodes[timer[1]]
                node.handle_timer(self.now)
                self._flush(timer[1])
            else:
                _, _, src, dst, msg = heapq.heappop(self.queue)
                self._deliver(src, dst, msg)
        self.now = t

    def _next_timer(self):
        best = None
        for name, node in self.nodes.items():
            if name in self.dead:
                continue
            at = node.get_timer()
            if at is not None and (best is None or at < best[0]):
                best = (max(at, self.now), name)
        return best

    def _deliver(self, src: str, dst: str, msg) -> None:
        if dst in self.dead or src in self.dead or (src, dst) in self.cut:
            return
        if dst in self.witnesses:
            answer = self.witnesses[dst].receive(src, msg, self.now)
            if answer is not None:
                self._send(dst, src, answer)
        elif dst in self.nodes:
            self.nodes[dst].receive(src, src, msg, self.now)
            self._flush(dst)

    def _send(self, src: str, dst: str, msg) -> None:
        heapq.heappush(self.queue, (self.now + self.delay, next(self.seq), src, dst, msg))

    def _flush(self, name: str) -> None:
        node = self.nodes[name]
        epoch = node.epoch_to_persist()
        if epoch is not None:
            self.disk[name] = epoch
        digest = node.confirmed_to_persist()
        if digest is not None:
            self.confirmed[name] = digest
        for address, msg in node.datagrams_to_send():
            self._send(name, address, msg)
        while (event := node.next_event()) is not None:
            self.log.append((self.now, name, event))

    # -- questions ------------------------------------------------------------------

    def holders(self) -> list[str]:
        return [n for n, e in self.nodes.items() if n not in self.dead and e.holding(self.now)]

    def acquisitions(self) -> list[tuple[float, str, int]]:
        return [(t, n, e.epoch) for t, n, e in self.log if isinstance(e, Acquired)]

    def losses(self) -> list[tuple[float, str, str]]:
        return [(t, n, e.reason) for t, n, e in self.log if isinstance(e, Lost)]

    def renewals(self, name: str) -> list[Renewed]:
        return [e for _, n, e in self.log if n == name and isinstance(e, Renewed)]
