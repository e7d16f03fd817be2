"""``python -m bench.relay.micro``: the relay agent alone (sans-IO), in CPU µs per DORA.

The four messages of one exchange as bench.relay's run carries them through
``RelayAgent`` (plugins/relay/agent.py), without sockets, trio or the kernel: a
client's DISCOVER and REQUEST (templates of bench/relay/wire.py, broadcast flag set)
through ``from_client``, Kea-shaped OFFER and ACK (option 82 echoed) through
``from_server``. Best of N rounds of this thread's CPU time. Subtracted from the
relay's user time per DORA in bench.relay, it leaves the shell's share (the receive
loop, ancillary data, address conversions, trio's wake-ups).
"""

from __future__ import annotations

import argparse
import time

from bench.dhcp.probe import ACK, DISCOVER, OFFER, REQUEST
from bench.relay import wire
from plugins.relay.agent import Link, RelayAgent, RelayConfig

IFACE = "cli-bench"
DOWN, SERVER, YIADDR = bytes([10, 1, 0, 1]), bytes([10, 2, 0, 2]), bytes([10, 1, 1, 0])


def kea_reply(forwarded: bytes, kind: int) -> bytes:
    """A server's answer to ``forwarded``: op 2, yiaddr set, the usual options, option
    82 echoed last (as Kea does), END."""
    start = forwarded.index(bytes([82]), 240)  # the relay appended option 82 before END
    option82 = forwarded[start : start + 2 + forwarded[start + 1]]
    header = bytes([2]) + forwarded[1:16] + YIADDR + forwarded[20:240]
    options = bytes([53, 1, kind, 54, 4, *SERVER, 51, 4, 0, 0, 14, 16, 1, 4, 255, 255, 0, 0])
    options += bytes([3, 4, *DOWN, 6, 4, *SERVER])
    return header + options + option82 + b"\xff"


def exchange() -> tuple[RelayAgent, list]:
    agent = RelayAgent(
        RelayConfig(
            links=(Link(IFACE, int.from_bytes(DOWN, "big"), IFACE.encode()),),
            servers=(int.from_bytes(SERVER, "big"),),
        )
    )
    mac, flags = wire.TEMPLATE_MAC, wire.BROADCAST_FLAG
    discover = wire.client_message(DISCOVER, 1, mac, flags)
    request = wire.client_message(REQUEST, 1, mac, flags, bytes([50, 4, *YIADDR, 54, 4, *SERVER]))
    offer = kea_reply(agent.from_client(discover, IFACE).payload, OFFER)
    ack = kea_reply(agent.from_client(request, IFACE).payload, ACK)
    server = int.from_bytes(SERVER, "big")
    steps = [
        ("from_client DISCOVER", lambda: agent.from_client(discover, IFACE)),
        ("from_server OFFER", lambda: agent.from_server(offer, server)),
        ("from_client REQUEST", lambda: agent.from_client(request, IFACE)),
        ("from_server ACK", lambda: agent.from_server(ack, server)),
    ]
    for name, step in steps:  # every step relays: nothing is dropped
        if step() is None:
            raise SystemExit(f"{name}: dropped ({dict(agent.dropped)}): the shapes are wrong")
    return agent, steps


def best_us(step, count: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(count):
            step()
        best = min(best, (time.thread_time() - t0) / count * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.relay.micro", description=__doc__)
    p.add_argument("--count", type=int, default=20_000, help="calls per round (default 20000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the best counts (default 5)")
    args = p.parse_args(argv)
    _, steps = exchange()
    total = 0.0
    for name, step in steps:
        us = best_us(step, args.count, args.rounds)
        total += us
        print(f"{name:<22} {us:6.2f} µs")
    print(f"{'per DORA (4 messages)':<22} {total:6.2f} µs  (best of {args.rounds} x {args.count})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
