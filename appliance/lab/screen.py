"""``rackboot lab``'s output: step lines, each stamped with the seconds since the lab
started, and the rack's status block. On a terminal the block is redrawn in place
under the steps; elsewhere (a log, CI) it is printed again only when it changed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TextIO

ERASE_UP = "\x1b[{n}F\x1b[J"  # to the start of the line n lines up, then clear below


class Screen:
    def __init__(self, stream: TextIO, live: bool) -> None:
        self.stream = stream
        self.live = live  # a terminal: redraw the block in place
        self.started = time.monotonic()
        self._block: list[str] = []
        self._drawn = 0
        self._key: object = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        """A step: it stays on screen, above the block."""
        self._erase()
        self.stream.write(f"[{self.elapsed():6.1f} s] {text}\n")
        self._draw()

    def show(self, lines: Sequence[str], key: object) -> None:
        """The status block; ``key``: what it says, without the ticking times."""
        changed = key != self._key
        self._key = key
        self._block = list(lines)
        if self.live:
            self._erase()
            self._draw()
        elif changed:
            self.stream.write("".join(f"{line}\n" for line in self._block))
            self.stream.flush()

    def freeze(self) -> None:
        """Leave the block as it stands, no longer redrawn: what follows goes below it."""
        self._block, self._drawn = [], 0

    def _erase(self) -> None:
        if self.live and self._drawn:
            self.stream.write(ERASE_UP.format(n=self._drawn))
        self._drawn = 0

    def _draw(self) -> None:
        if self.live and self._block:
            self.stream.write("".join(f"{line}\n" for line in self._block))
            self._drawn = len(self._block)
        self.stream.flush()
