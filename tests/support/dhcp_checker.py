"""Checks what DHCP clients were told against each other and against a server's leases (pure).

Input: the lines of tests/support/dhcp_churn.py (``ack T MAC ADDRESS LEASE
SERVER``, ``nak ...``). Two promises must hold whatever happened to the
servers meanwhile (kills, pauses, partitions, failovers):

* **no address is bound to two machines at once**: the validity of an ACK
  runs from the time its client sent the request (T) for LEASE seconds
  (RFC 2131 §4.4.1, what the client believes); two different MACs whose
  validities of one address overlap are a violation;
* **every acknowledged lease survives**: each MAC's last ACK that is still
  valid at a moment ``at`` must be in the server's lease table, bound to
  that MAC, expiring no earlier than the client believes (less a tolerance
  for the time between the request and the server's clock reading).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Ack:
    sent: float
    mac: str
    address: str
    lease: float
    server: str

    @property
    def until(self) -> float:
        return self.sent + self.lease


@dataclass(frozen=True)
class Nak:
    sent: float
    mac: str
    address: str  # the address the client held ("-": none), which it must stop using


def parse(lines: list[str]) -> list[Ack | Nak]:
    out: list[Ack | Nak] = []
    for line in lines:
        parts = line.split()
        if len(parts) == 6 and parts[0] == "ack":
            out.append(Ack(float(parts[1]), parts[2], parts[3], float(parts[4]), parts[5]))
        elif len(parts) == 5 and parts[0] == "nak":
            out.append(Nak(float(parts[1]), parts[2], parts[3]))
    return out


def double_bindings(answers: list[Ack | Nak]) -> list[str]:
    """Addresses two MACs held at once, each named with the ACK that broke the promise.
    A client holds an address from an ACK until its lease ends or a NAK tells it to stop."""
    reach: dict[str, dict[str, tuple[float, Ack]]] = defaultdict(dict)  # address -> mac -> ...
    problems = []
    for answer in sorted(answers, key=lambda a: a.sent):
        held = reach[answer.address]
        if isinstance(answer, Nak):
            if answer.mac in held:
                until, ack = held[answer.mac]
                held[answer.mac] = (min(until, answer.sent), ack)
            continue
        for mac, (until, ack) in held.items():
            if mac != answer.mac and answer.sent < until:
                problems.append(
                    f"{answer.address}: {answer.mac} acked at {answer.sent:.3f} (by "
                    f"{answer.server}) while {mac} held it until {until:.3f} (acked at "
                    f"{ack.sent:.3f} by {ack.server})"
                )
        mine = held.get(answer.mac)
        held[answer.mac] = (max(answer.until, mine[0] if mine else 0.0), answer)
    return problems


def lost_leases(answers: list[Ack | Nak], leases: dict[str, tuple[str, float]], at: float,
                tolerance: float = 1.0) -> list[str]:  # fmt: skip
    """Acknowledged leases still valid at ``at`` that the server's table lacks.
    ``leases``: address -> (MAC, expiry wall time) of the server's bound leases."""
    last: dict[str, Ack] = {}
    for answer in sorted(answers, key=lambda a: a.sent):
        if isinstance(answer, Ack):
            last[answer.mac] = answer
        elif answer.mac in last:
            del last[answer.mac]  # told to stop: nothing to keep
    problems = []
    for mac, ack in sorted(last.items()):
        if ack.until <= at + tolerance:
            continue  # expired, or about to: the server may have let it go
        held = leases.get(ack.address)
        if held is None or held[0] != mac:
            problems.append(f"{mac} was acked {ack.address} until {ack.until:.3f}: the server "
                            f"has {held[0] + ' on it' if held else 'no lease for it'}")  # fmt: skip
        elif held[1] < ack.until - tolerance:
            problems.append(f"{mac} was acked {ack.address} until {ack.until:.3f}: the server's "
                            f"lease ends at {held[1]:.3f}")  # fmt: skip
    return problems
