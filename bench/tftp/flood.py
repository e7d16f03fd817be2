"""A bounded flood of TFTP read requests that are never acknowledged (issue 16).

``python -m bench.tftp.flood SERVER PORT --file NAME --count 500 --seconds 2 --hold 3
[--sources A,B,...]``

Sends ``count`` RRQs for ``NAME``, each from its own UDP socket (its own source
port; with ``--sources``, bound to those local addresses in turn: a flood from
many hosts, or one host's many addresses), evenly over ``seconds``; reads nothing while sending and acknowledges
nothing. Prints ``sent`` on a line of its own once the last request left (a
caller starts its legitimate download then), keeps every socket open ``hold``
seconds more (so the server's DATA meets no ICMP port unreachable and lingers,
the worst case for the server), then counts what each socket received and
prints one JSON line:

``requests``, ``bytes_sent``, ``bytes_received``, ``sockets_with_data`` (sockets
that got at least one DATA block), ``errors`` (ERROR packets received), and
``most_to_a_refused_socket`` (the most bytes any socket without DATA received:
a server that does not amplify keeps it at or below ``request_size``).

Used by bench.tftp's ``flood`` scenario and tests/real/test_tftp_flood.py. Every
loop is bounded by ``count`` and the socket buffers; nothing runs past
``seconds + hold`` plus the drain.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import sys
import time

OPCODE_DATA, OPCODE_ERROR = 3, 5
DRAIN_LIMIT = 1000  # datagrams read from one socket at most (its buffer holds fewer)


def rrq(name: str) -> bytes:
    return b"\x00\x01" + name.encode() + b"\x00octet\x00"


def flood(server: str, port: int, name: str, count: int, seconds: float, hold: float,
          announce=lambda: None, sources: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """Send the flood, hold, drain; the summary described in the module docstring."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 64), hard))
    request = rrq(name)
    socks = []
    try:
        start = time.monotonic()
        for i in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(sock)
            if sources:
                sock.bind((sources[i % len(sources)], 0))
            delay = start + i * seconds / count - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sock.sendto(request, (server, port))
        announce()
        time.sleep(hold)
        return _count(socks, len(request), count)
    finally:
        for sock in socks:
            sock.close()


def _count(socks: list[socket.socket], size: int, count: int) -> dict:
    received = with_data = errors = most_refused = 0
    for sock in socks:
        sock.setblocking(False)
        got, data = 0, False
        for _ in range(DRAIN_LIMIT):
            try:
                datagram = sock.recv(70_000)
            except OSError:  # empty (BlockingIOError), or an ICMP error queued
                break
            got += len(datagram)
            kind = int.from_bytes(datagram[:2], "big")
            data |= kind == OPCODE_DATA
            errors += kind == OPCODE_ERROR
        received += got
        if data:
            with_data += 1
        else:
            most_refused = max(most_refused, got)
    return {
        "requests": count, "request_size": size, "bytes_sent": count * size,
        "bytes_received": received, "sockets_with_data": with_data, "errors": errors,
        "most_to_a_refused_socket": most_refused,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.tftp.flood", description=__doc__.splitlines()[0]
    )
    p.add_argument("server")
    p.add_argument("port", type=int)
    p.add_argument("--file", default="big.bin", help="name asked for (an existing file)")
    p.add_argument("--count", type=int, default=500, help="requests, one source port each")
    p.add_argument("--seconds", type=float, default=2.0, help="spread over this long")
    p.add_argument("--hold", type=float, default=3.0, help="keep the sockets open this long after")
    p.add_argument("--sources", default="", help="comma-separated local addresses to send from, in turn")
    args = p.parse_args(argv)

    def announce() -> None:
        print("sent", flush=True)

    sources = tuple(a for a in args.sources.split(",") if a)
    summary = flood(args.server, args.port, args.file, args.count, args.seconds, args.hold,
                    announce, sources)  # fmt: skip
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
