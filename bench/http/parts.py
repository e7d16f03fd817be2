"""``python -m bench.http.parts``: where a boot script's CPU goes, part by part.

bench.http's ``scripts`` scenario measures the whole: a machine's script, a new
boot each (a record committed to the state log before the answer). This splits
it into what can be measured apart, on loopback, the server on ``--server-cpu``
and wrk (``-t1 -c16``, keep-alive) on ``--client-cpu``:

* ``route``: the HTTP path alone, HttpServer with two routes answering the same
  288 bytes of text, one a plain function (answered in the lane) and one
  ``async def`` that awaits nothing (handed to its connection's task): CPU µs
  per request of each;
* ``handler``: the script route alone, in one process, 16 tasks calling it
  over a real state store (group commit, fdatasync) as 16 connections do: a new
  boot each (bench.http's case) and the same boot reused (a DHCP lease already
  served a script), CPU µs per script.

Medians of ``--repeats`` runs. Not a comparison with nginx: bench.http is.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from ipaddress import IPv4Address
from pathlib import Path

import prometheus_client
import trio

TEXT = "x" * 288  # the size of bench.http's script
MAC = "52:54:00:12:34:56"
TICKS = os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.http.parts", description=__doc__.splitlines()[0]
    )
    p.add_argument("--parts", default="route,handler", help="which, in order (route,handler)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each (3)")
    p.add_argument("--seconds", type=int, default=3, help="length of one wrk run (3)")
    p.add_argument("--scripts", type=int, default=20_000, help="scripts per handler run (20000)")
    p.add_argument("--port", type=int, default=18095, help="loopback port of the route part")
    p.add_argument("--server-cpu", default="0", help="the server's CPU (0)")
    p.add_argument("--client-cpu", default="1", help="wrk's CPU (1)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the route part's child
    return p.parse_args(argv)


# -- route: the HTTP path of a plain and of an awaiting handler -------------------------


def _plain(request):
    from plugins.httpboot.messages import Response

    return Response.text(TEXT)


async def _awaiting(request):
    return _plain(request)


async def _serve(port: int) -> None:
    from appliance.logs import setup_logging
    from plugins.httpboot.connection import Limits
    from plugins.httpboot.messages import Route
    from plugins.httpboot.router import Router
    from plugins.httpboot.server import HttpServer
    from plugins.httpboot.stats import Stats

    setup_logging("kv", "info", open(os.devnull, "w"))  # noqa: SIM115 (the process's life)
    routes = Router([Route("GET", "/plain", _plain), Route("GET", "/awaiting", _awaiting)])
    server = HttpServer((IPv4Address("127.0.0.1"),), port, routes, Limits(), Stats(), 512)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        print("listening", flush=True)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _wrk(url: str, pid: int, args: argparse.Namespace) -> float:
    """CPU µs of ``pid`` per request over one wrk run on ``url``."""
    before = _cpu(pid)
    out = subprocess.run(["taskset", "-c", args.client_cpu, "wrk", "-t1", "-c16",
                          f"-d{args.seconds}s", url], capture_output=True, text=True,
                         timeout=args.seconds + 60).stdout  # fmt: skip
    total = re.search(r"(\d+) requests in", out)
    if total is None or re.search(r"Non-2xx", out):
        raise RuntimeError(f"wrk failed: {out[-400:]}")
    return (_cpu(pid) - before) * 1e6 / int(total.group(1))


def route_part(args: argparse.Namespace) -> dict[str, list[float]]:
    server = subprocess.Popen(
        ["taskset", "-c", args.server_cpu, sys.executable, "-m", "bench.http.parts", "--serve",
         "--port", str(args.port)], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "listening":
            raise RuntimeError("the server did not start")
        runs: dict[str, list[float]] = {"plain": [], "awaiting": []}
        for _ in range(args.repeats):
            for name, cpu in runs.items():
                cpu.append(_wrk(f"http://127.0.0.1:{args.port}/{name}", server.pid, args))
        return runs
    finally:
        server.terminate()
        server.wait(10)


# -- handler: the script route over a real state store ---------------------------------


def _script_routes(directory: Path):
    from appliance.ha.fence import Fence
    from appliance.state.store import StateStore
    from plugins.httpboot.machines import Machines
    from plugins.httpboot.routes import BootPolicy, BuiltinRoutes
    from plugins.httpboot.script import Profile
    from plugins.httpboot.stats import Stats
    from plugins.httpboot.store import EventStore, Secret

    fence = Fence(trio.current_time)
    fence.grant(math.inf, 1)
    state = StateStore(directory, fence)
    state.load()
    policy = BootPolicy({"default": Profile("default", "vmlinuz", ("initrd.img",))}, {}, "default")
    return BuiltinRoutes(
        root=directory, policy=policy, secret=Secret(state), store=EventStore(state, 16),
        stats=Stats(), public_url="", admin_token="", max_event_bytes=4096, is_active=lambda: True,
        status=dict, metrics=prometheus_client.CollectorRegistry(), script_hook=lambda **kw: None, event_hook=lambda event: None,
        machines=Machines(state, reservations={}, bind=False), node_name="bench",
    )  # fmt: skip


async def _scripts(count: int, reuse: bool) -> float:
    """CPU µs per script, 16 tasks asking at once; ``reuse``: under one lease (no record)."""
    from plugins.httpboot.machines import Standing
    from plugins.httpboot.messages import Request

    with tempfile.TemporaryDirectory(prefix="rackboot-bench-parts-") as directory:
        routes = _script_routes(Path(directory))
        state = routes.machines.state
        async with trio.open_nursery() as nursery:
            await nursery.start(state.run)
            await routes.secret.ensure(None, "bench")
            if reuse:
                leased = Standing("lease", 1.0)
                routes.machines.standing = lambda mac, client: leased  # type: ignore[method-assign]
                await routes.machines.new_boot(MAC, "10.0.0.2", leased, "bench")
            left = count

            async def asker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    request = Request("GET", "/boot/x.ipxe", b"", {}, ("10.0.0.2", 1),
                                      ("10.0.0.1", 80), params={"mac": MAC})  # fmt: skip
                    answer = routes.script(request)  # awaitable only for a new boot
                    if inspect.isawaitable(answer):
                        answer = await answer
                    if answer.status != 200:
                        raise RuntimeError("the script route refused")

            before = resource.getrusage(resource.RUSAGE_SELF)
            async with trio.open_nursery() as askers:
                for _ in range(16):
                    askers.start_soon(asker)
            after = resource.getrusage(resource.RUSAGE_SELF)
            nursery.cancel_scope.cancel()
    used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return used * 1e6 / count


def handler_part(args: argparse.Namespace) -> dict[str, list[float]]:
    os.sched_setaffinity(0, {int(args.server_cpu)})
    runs: dict[str, list[float]] = {"new boot": [], "reused boot": []}
    for _ in range(args.repeats):
        for name, cpu in runs.items():
            cpu.append(trio.run(_scripts, args.scripts, name == "reused boot"))
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        trio.run(_serve, args.port)
        return 0
    print(f"bench.http.parts: medians of {args.repeats}, server cpu {args.server_cpu}, "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
    for part in args.parts.split(","):
        runs = {"route": route_part, "handler": handler_part}[part](args)
        for name, cpu in runs.items():
            print(f"{part:8s} {name:12s} {statistics.median(cpu):6.1f} µs CPU/request  "
                  f"(runs {[round(c, 1) for c in cpu]})")  # fmt: skip
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
