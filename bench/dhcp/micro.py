"""CPU cost of Rackboot's DHCP hot path without sockets: ``python -m bench.dhcp.micro``.

Feeds the sans-IO :class:`~plugins.dhcp.server.DhcpServer` the exchanges
perfdhcp makes (relayed DISCOVER, then REQUEST for the offered address, every
client new) and times, per DORA, the parts the trio shell runs per packet:
``handle`` (parse, decide, build), the metrics, and what a lease costs in the
trio thread on the state log: ``append`` (the lease store's record, the state
log's encoding and frame), ``commit`` (the table of the state log, the
callbacks that would send the ACK) and ``feed`` (the changefeed's change, the
lease decoded and applied to the server's table, its pending entry dropped).
No sockets, no fdatasync, no trio: the remainder of the full benchmark's
``cpu µs/DORA`` is the system calls, the event loop and the writer's thread.
``--built`` answers every message through the general ``build()`` rather than
the pre-encoded option blocks the server uses for such replies (the difference
is what those save).

Needs no root; runs in a few seconds. ``--profile`` prints a cProfile of the loop.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import struct
import sys
import time
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from appliance.ha.fence import Fence  # noqa: E402
from appliance.state.store import Change, Position, StateStore  # noqa: E402
from plugins.dhcp.leases import NAMESPACE, LeaseView, lease_from_state_untrusted  # noqa: E402
from plugins.dhcp.model import ServerConfig, Subnet  # noqa: E402
from plugins.dhcp.server import Arrival, DhcpServer  # noqa: E402
from plugins.dhcp.store import LeaseStore  # noqa: E402

MAGIC = b"\x63\x82\x53\x63"
NETWORK = IPv4Network("10.99.0.0/16")
SERVER, RELAY = IPv4Address("10.99.0.1"), IPv4Address("10.99.0.2")
OPT54 = bytes([54, 4]) + SERVER.packed


def packet(kind: int, xid: int, mac: bytes, extra: bytes = b"") -> bytes:
    """A BOOTREQUEST shaped like perfdhcp's (bench/README.md, "What perfdhcp sends")."""
    header = struct.pack(
        "!BBBBIHH4s4s4s4s16s64s128s", 1, 1, 6, 1, xid, 0, 0,
        bytes(4), bytes(4), bytes(4), RELAY.packed, mac.ljust(16, b"\0"), b"", b"",
    )  # fmt: skip
    options = bytes([53, 1, kind, 55, 7, 1, 28, 2, 3, 15, 6, 12, 61, 7, 1]) + mac + extra
    return header + MAGIC + options + b"\xff"


def make_server() -> DhcpServer:
    base = int(NETWORK.network_address)
    subnet = Subnet(
        NETWORK,
        pools=((base + 256, base + 255 * 256 + 250),),
        router=SERVER,
        dns=(SERVER,),
    )
    return DhcpServer(ServerConfig(subnets=(subnet,), lease_time=3600), LeaseView())


def make_store(server: DhcpServer) -> tuple[StateStore, LeaseStore]:
    """A state log that is never written (no file, no writer): commits are made by hand."""
    fence = Fence(lambda: 0.0)
    fence.grant(float("inf"), epoch=1)
    state = StateStore(Path("/nonexistent/state"), fence)
    return state, LeaseStore(state, server.leases)


def feed(state: StateStore, store: LeaseStore, after: int) -> None:
    """What the changefeed task does for the records after ``after`` (as subscribe yields)."""
    table, view = store.table, store.view
    for record in state.tail[after - state.base :]:
        change = Change(Position(record.epoch, record.lsn), record.key, record.value)
        if record.ns == NAMESPACE:
            lease = store._own.pop(change.position.lsn, None)
            table.apply(lease or lease_from_state_untrusted(change.key, change.value))
            table.epoch, table.lsn = change.position.epoch, change.position.lsn
            view.caught_up()


def run(count: int, *, metrics: bool, chunk: int = 100, prepared: bool = True) -> dict[str, float]:
    """Time ``count`` DORAs, ``chunk`` clients at a time; returns CPU µs per DORA by part.

    The clock is this thread's CPU time, read once per chunk and part: other
    processes on a shared machine then inflate the figures much less.
    """
    server = make_server()
    server.prepared_replies = prepared
    state, store = make_store(server)
    arrival = Arrival("srv0", int(SERVER), (str(RELAY), 67))
    count_metrics = None
    if metrics:
        from prometheus_client import CollectorRegistry

        from plugins.dhcp.metrics import DhcpMetrics

        m = DhcpMetrics(CollectorRegistry(), server)

        def count_metrics(outcome) -> None:
            m.count(outcome)
            for reply in outcome.replies:
                m.sent(reply.kind)

    macs = [b"\x00\x0c" + i.to_bytes(4, "big") for i in range(count)]
    now = time.time()
    spent = {"handle": 0.0, "append": 0.0, "commit": 0.0, "feed": 0.0, "metrics": 0.0}
    acked: list[int] = []
    clock = time.thread_time
    gc.collect()
    for first in range(0, count, chunk):
        ids = range(first, min(count, first + chunk))
        discovers = [packet(1, i, macs[i]) for i in ids]
        t0 = clock()
        offers = [server.handle(d, arrival, now) for d in discovers]
        t1 = clock()
        requests = [
            packet(3, i, macs[i], bytes([50, 4]) + o.replies[0].payload[16:20] + OPT54)
            for i, o in zip(ids, offers, strict=True)
        ]
        t2 = clock()
        acks = [server.handle(r, arrival, now) for r in requests]
        t3 = clock()
        for ack in acks:
            store.commit(ack.commits, lambda: acked.append(1))
        t4 = clock()
        before = state.tables.lsn
        state.durable = state.last()  # what the writer's fdatasync and the standby say
        state.advance()
        t5 = clock()
        feed(state, store, before)
        t6 = clock()
        if count_metrics is not None:
            for outcome in (*offers, *acks):
                count_metrics(outcome)
        t7 = clock()
        if any(not a.replies or a.replies[0].kind != 5 for a in acks):
            raise SystemExit(f"chunk at {first}: not every REQUEST was ACKed")
        spent["handle"] += (t1 - t0) + (t3 - t2)
        spent["append"] += t4 - t3
        spent["commit"] += t5 - t4
        spent["feed"] += t6 - t5
        spent["metrics"] += t7 - t6
    if len(acked) != count or server.leases.pending():
        raise SystemExit(
            f"{len(acked)} of {count} ACKs committed, {server.leases.pending()} pending"
        )
    result = {k: v * 1e6 / count for k, v in spent.items()}
    result["total"] = sum(result.values())
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dhcp.micro", description=__doc__)
    p.add_argument("--count", type=int, default=20_000, help="DORAs per round (default 20000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the best counts (default 5)")
    p.add_argument("--no-metrics", action="store_true", help="leave the Prometheus counters out")
    p.add_argument("--profile", action="store_true", help="print a cProfile of one round")
    p.add_argument(
        "--built", action="store_true", help="every reply through build(), no pre-encoded blocks"
    )
    args = p.parse_args(argv)
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(run, args.count, metrics=not args.no_metrics, prepared=not args.built)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0
    rounds = [
        run(args.count, metrics=not args.no_metrics, prepared=not args.built)
        for _ in range(max(1, args.rounds))
    ]
    best = min(rounds, key=lambda r: r["total"])
    print(
        f"sans-IO DORA, {args.count} new clients, best of {len(rounds)} rounds"
        f"{', replies built' if args.built else ''} "
        f"(Python {sys.version.split()[0]}): "
        + "  ".join(f"{k} {v:.1f} µs" for k, v in best.items())
        + f"  -> {1e6 / best['total']:,.0f} DORA/s of one CPU"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
