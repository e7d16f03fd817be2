"""The VIP guard: a small process of its own that owns the rack's virtual IP on this node.

Why a process: the VIP must leave a holder's kernel before any other appliance
can be granted the lease, also when the node's process is killed (``kill -9``,
a crash) or frozen (SIGSTOP, a swap storm), and then nothing in that process
runs. A kernel address lifetime cannot do it alone: it counts in whole seconds
(and the kernel checks it up to a quarter second late) against a 1 s lease.
So the node tells this guard, after every grant and renewal, until when it
may hold the address (the fence's end less ``step_down_lead``, on
CLOCK_BOOTTIME, which both processes read alike), and the guard removes the
address at that moment unless told a later one, and at once when the node's
end of the pipe closes (the node died). The kernel lifetime (:data:`LIFETIME`,
refreshed every :data:`REFRESH` s) stays as the last resort for when both
processes die at once.

Protocol, one line each. On stdin: ``hold DEADLINE`` (hold the address until
then) or ``drop``; end of file: the node is gone, drop the address and exit.
On stdout: ``held``, ``dropped``, ``error TEXT``.

Standard library only, run by file path (``python -I -S vipguard.py IFACE
ADDRESS/PREFIX``: ~9 MB and tens of milliseconds to start, where pyroute2
alone costs 33 MB and 0.85 s); address changes go through iproute2's ``ip``.
:class:`GuardCore` is the decision logic with explicit time (unit-tested);
:func:`main` is the loop around it. SIGINT and SIGTERM are ignored: only the
node (its commands, or its death) decides, so a signal sent to the whole
service cannot make the guard drop the address under a node that still holds.
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import time

LIFETIME = 2  # s, the kernel's own removal if guard and node die together
REFRESH = 0.5  # s between lifetime refreshes while held
RETRY = 0.25  # s after a failed `ip` before trying again
GIVE_UP = 8  # removals tried after the node is gone, before exiting anyway
IP_TIMEOUT = 2.0
MAX_RETRY = 8.0  # s: failures in a row back off up to this
# What iproute2 says when the address to remove is not there (older, newer kernels)
ABSENT = ("Cannot assign requested address", "Address not found")


class GuardCore:
    """Decides when to add, refresh and remove the address (``now``: CLOCK_BOOTTIME)."""

    def __init__(self, refresh: float = REFRESH, retry: float = RETRY) -> None:
        self.refresh, self.retry = refresh, retry
        self.deadline = -math.inf
        self.present = True  # unknown at start: a crashed earlier life may have left it
        self.next_refresh = -math.inf
        self.retry_at = -math.inf  # after a failed action, not before this
        self.backoff = retry
        self.done = False

    def command(self, line: str) -> str | None:
        """One line from the node; an error text when it is not understood."""
        word, _, arg = line.strip().partition(" ")
        if word == "hold":
            try:
                deadline = float(arg)
            except ValueError:
                deadline = math.nan
            if not math.isfinite(deadline):
                return f"bad deadline {arg[:40]!r}"
            self.deadline = deadline
        elif word == "drop":
            self.deadline = -math.inf
        else:
            return f"unknown command {line.strip()[:40]!r}"
        return None

    def node_gone(self) -> None:
        self.deadline = -math.inf
        self.done = True

    def actions(self, now: float) -> list[str]:
        """``add`` (or refresh its lifetime) or ``remove``, when due now."""
        if now < self.retry_at:
            return []
        if now < self.deadline:
            if not self.present or now >= self.next_refresh:
                self.present, self.next_refresh = True, now + self.refresh
                return ["add"]
        elif self.present:
            self.present = False
            return ["remove"]
        return []

    def failed(self, action: str, now: float) -> None:
        """An action failed: believe the address is as it was, and retry later (backing off
        while failures repeat, so a vanished interface does not fill the log)."""
        self.present = action == "remove"
        self.retry_at = now + self.backoff
        self.backoff = min(self.backoff * 2, MAX_RETRY)

    def succeeded(self) -> None:
        self.backoff = self.retry

    def timeout(self, now: float) -> float | None:
        """Seconds until the next decision if no command comes; None: wait for one."""
        if now < self.deadline:
            due = self.next_refresh if self.present else self.retry_at
            return max(0.0, min(self.deadline, due) - now)
        return max(0.0, self.retry_at - now) if self.present else None


def ip_argv(action: str, interface: str, cidr: str) -> list[str]:
    if action == "add":
        return ["ip", "-4", "addr", "replace", cidr, "dev", interface,
                "valid_lft", str(LIFETIME), "preferred_lft", str(LIFETIME)]  # fmt: skip
    return ["ip", "-4", "addr", "del", cidr, "dev", interface]


def run_ip(action: str, interface: str, cidr: str) -> str | None:
    """None on success; otherwise what went wrong. Removing an absent address succeeds."""
    try:
        res = subprocess.run(ip_argv(action, interface, cidr), capture_output=True, text=True,
                             timeout=IP_TIMEOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if res.returncode == 0:
        return None
    text = res.stderr.strip() or f"exit {res.returncode}"
    if action == "remove" and any(absent in text for absent in ABSENT):
        return None
    return text


def say(text: str) -> None:
    try:
        os.write(1, text.encode() + b"\n")
    except OSError:
        pass  # the node is gone; its end of stdin will tell us too


def main(argv: list[str]) -> int:
    interface, cidr = argv
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    core, pending, tries = GuardCore(), b"", 0
    while True:
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        for action in core.actions(now):
            error = run_ip(action, interface, cidr)
            if error is None:
                core.succeeded()
                say("held" if action == "add" else "dropped")
            else:
                core.failed(action, now)
                say(f"error {action}: {error}")
        if core.done:
            tries += 1
            if not core.present or tries >= GIVE_UP:
                return 0 if not core.present else 1
        readable, _, _ = select.select([] if core.done else [0], [], [], core.timeout(now))
        if not readable:
            continue
        data = os.read(0, 4096)
        if not data:
            core.node_gone()
            continue
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            error = core.command(line.decode(errors="replace"))
            if error is not None:
                say(f"error {error}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
