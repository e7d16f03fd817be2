"""Why the election has its own signed UDP datagrams: the cost of one exchange both ways.

    flock /tmp/rackboot-bench.lock python -m bench.failover.transport [--count 2000]

On loopback, one trio process, the same message (a ``prepare`` and its
``promise``):

* signed UDP: seal (Ed25519 + certificate), send, open (certificate cached,
  signature checked), answer the same way;
* the cluster's TLS 1.3 link: the message framed as the peer links frame
  theirs, over an established mutually authenticated ``SSLStream``.

Prints the median and p99 round trip of each and the CPU of sealing and
opening one datagram.

``--loss P`` (root): the same exchanges inside a network namespace made for
the run, where nftables drops each packet arriving on its loopback with
probability P. UDP retries a lost exchange after 50 ms (a holder retries a
failed round after ``renew / 4``); TCP recovers by itself. Prints how long
exchanges took (median, p90, p99, max) and how many took over 200 ms.
"""

from __future__ import annotations

import argparse
import datetime as dt
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from appliance.cluster import pki, wire
from appliance.cluster.transport import client_context, server_context
from appliance.ha.envelope import Opener, seal
from appliance.ha.messages import Prepare, Promise, decode_untrusted, encode
from appliance.ha.witness import load_identity
from tests.support.ha import enrol_members

# Shaped as the election's: a membership digest and two appliances' ids
PREPARE = Prepare("rack1", 1, 1, "d" * 16, ["a" * 16, "b" * 16])
PROMISE = Promise("rack1", 1, 1, True, "", "", 0, 0.0, 3, False, 1, "a" * 16, "d" * 16)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(q * len(ordered) + 0.999999) - 1)]


def crypto_cost(identity, count: int) -> tuple[float, float]:
    der = pki.cert_der(identity.cert)
    opener = Opener(identity.ca)
    now = dt.datetime.now(dt.UTC)
    started = time.perf_counter()
    for _ in range(count):
        datagram = seal(PREPARE, identity.key, der)
    sealing = (time.perf_counter() - started) / count
    opener.open_untrusted(datagram, now)  # the certificate check, once
    started = time.perf_counter()
    for _ in range(count):
        opener.open_untrusted(datagram, now)
    return sealing, (time.perf_counter() - started) / count


async def udp_exchanges(a, b, count: int, *, retry: float | None = None) -> list[float]:
    """``count`` prepare/promise exchanges as signed datagrams; ``retry``: resend after it."""
    sa = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sb = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await sa.bind(("127.0.0.1", 0))
    await sb.bind(("127.0.0.1", 0))
    der_a, der_b = pki.cert_der(a.cert), pki.cert_der(b.cert)
    opener_a, opener_b = Opener(a.ca), Opener(b.ca)
    now = dt.datetime.now(dt.UTC)
    times = []

    async def answer() -> None:
        while True:
            data, peer = await sb.recvfrom(4096)
            req = opener_b.open_untrusted(data, now)[1].req
            reply = Promise(**{**PROMISE.__dict__, "req": req})
            await sb.sendto(seal(reply, b.key, der_b), peer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        for n in range(count):
            request = seal(Prepare(**{**PREPARE.__dict__, "req": n}), a.key, der_a)
            started = time.perf_counter()
            while True:
                await sa.sendto(request, sb.getsockname())
                with trio.move_on_after(retry if retry is not None else float("inf")):
                    while opener_a.open_untrusted((await sa.recvfrom(4096))[0], now)[1].req != n:
                        pass
                    break
            times.append(time.perf_counter() - started)
            if retry is not None:
                await trio.sleep(0.002)
        nursery.cancel_scope.cancel()
    sa.close()
    sb.close()
    return times


async def tls_round_trips(a, b, count: int, pause: float = 0.0) -> list[float]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    times = []

    async def serve(stream: trio.SocketStream) -> None:
        tls = trio.SSLStream(stream, server_context(b), server_side=True)
        reader = wire.FrameReader()
        while True:
            data = await tls.receive_some(65536)
            if not data:
                return
            for message in reader.feed(data):
                decode_untrusted(message["m"])
                await tls.send_all(wire.encode({"t": "crl", "m": encode(PROMISE), "der": b""}))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tls = trio.SSLStream(tcp, client_context(a), server_hostname=None)
        await tls.do_handshake()
        reader = wire.FrameReader()
        for _ in range(count):
            started = time.perf_counter()
            # framed like a peer-link message (a 'crl' frame carries bytes: the shape fits)
            await tls.send_all(wire.encode({"t": "crl", "m": encode(PREPARE), "der": b""}))
            got: list = []
            while not got:
                got = reader.feed(await tls.receive_some(65536))
            decode_untrusted(got[0]["m"])
            times.append(time.perf_counter() - started)
            if pause:
                await trio.sleep(pause)
        nursery.cancel_scope.cancel()
    return times


RETRY = 0.05


async def udp_lossy(a, b, count: int) -> list[float]:
    return await udp_exchanges(a, b, count, retry=RETRY)


async def tls_lossy(a, b, count: int) -> list[float]:
    times = await tls_round_trips(a, b, count, pause=0.002)
    return times


def distribution(name: str, times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    slow = sum(1 for t in ms if t > 200)
    return (f"  {name:12} median {statistics.median(ms):7.2f} ms  p90 {percentile(ms, 0.9):7.2f}"
            f"  p99 {percentile(ms, 0.99):7.2f}  max {ms[-1]:8.2f}  over 200 ms: {slow}/{len(ms)}")  # fmt: skip


def lossy(args) -> int:
    """Re-run this module inside a namespace whose loopback drops packets."""
    import secrets
    import subprocess

    ns = f"rbloss{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for command in (
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "netns", "exec", ns, "nft", "add", "table", "inet", "loss"],
            ["ip", "netns", "exec", ns, "nft", "add", "chain", "inet", "loss", "in",
             "{ type filter hook input priority 0; }"],
            ["ip", "netns", "exec", ns, "nft", "add", "rule", "inet", "loss", "in", "numgen",
             "random", "mod", "1000", "<", str(int(args.loss * 1000)), "drop"],
        ):  # fmt: skip
            subprocess.run(command, check=True)
        return subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "bench.failover.transport",
             "--inside", "--loss", str(args.loss), "--count", str(args.count)],
            cwd=Path(__file__).resolve().parents[2],
        ).returncode  # fmt: skip
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover.transport")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loss", type=float, default=0.0, help="drop probability per packet")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loss and not args.inside:
        return lossy(args)
    if args.loss:
        with tempfile.TemporaryDirectory() as tmp:
            dirs = enrol_members(Path(tmp), ["a", "b"])
            a, b = load_identity(str(dirs["a"])), load_identity(str(dirs["b"]))
            print(f"{args.loss:.0%} of packets dropped, {args.count} exchanges each:")
            print(distribution("signed UDP", trio.run(udp_lossy, a, b, args.count)))
            print(distribution("TLS 1.3 link", trio.run(tls_lossy, a, b, args.count)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        dirs = enrol_members(Path(tmp), ["a", "b"])
        a, b = load_identity(str(dirs["a"])), load_identity(str(dirs["b"]))
        sealing, opening = crypto_cost(a, args.count)
        udp, tls = [], []
        for _ in range(args.repeats):
            udp.append(statistics.median(trio.run(udp_exchanges, a, b, args.count)))
            tls.append(statistics.median(trio.run(tls_round_trips, a, b, args.count)))
    print(f"seal one datagram {sealing * 1e6:.0f} us, open one (certificate cached) "
          f"{opening * 1e6:.0f} us")  # fmt: skip
    print(f"round trip, median of {args.repeats} medians of {args.count}:")
    print(f"  signed UDP   {statistics.median(udp) * 1e6:7.0f} us")
    print(f"  TLS 1.3 link {statistics.median(tls) * 1e6:7.0f} us   "
          f"ratio UDP/TLS {statistics.median(udp) / statistics.median(tls):.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
