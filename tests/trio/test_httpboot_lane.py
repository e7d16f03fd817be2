"""The lane: kept-alive connections waiting in one epoll set, their common requests answered
there without waking their tasks; everything else handed back. Connections over real
socket pairs (the descriptors the lane polls), on the autojump clock."""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings

from plugins.httpboot import answering as answering_module
from plugins.httpboot.connection import Connection, Limits
from plugins.httpboot.lane import Lane
from plugins.httpboot.messages import Request, Response, Route
from plugins.httpboot.router import Router
from plugins.httpboot.stats import Stats
from tests.support.http import Client
from tests.trio.test_httpboot_plugin import builtin_routes
from tests.trio.test_httpboot_server import static
from tests.unit.httpboot.test_head import CURL, heads

SMALL = b"0123456789" * 100
BIG = os.urandom(200 << 10)  # more than the lane writes itself: sendfile, by the task


class AccessLines:
    """What the connection logs, as fields (without the time it took)."""

    def __init__(self) -> None:
        self.lines: list[dict] = []

    def info(self, msg: str, **fields) -> None:
        self.lines.append({k: v for k, v in fields.items() if k != "ms"})


def text(request: Request) -> Response:
    return Response.text(f"text {request.params['name']}")


async def slowly(request: Request) -> Response:
    await trio.sleep(1)
    return Response.text(f"slow {request.params['name']}")


def echo(request: Request) -> Response:
    return Response.text(f"got {request.body.decode()}")


async def framed(request: Request) -> Response:
    """Awaits, and sets a framing header of its own: h11 must write the head."""
    await trio.sleep(0)
    reply = Response.text("framed")
    reply.headers.append((b"connection", b"keep-alive"))
    return reply


HELD = [True]  # what the guard of a connection to the VIP says


async def lease_lost(request: Request) -> Response:
    HELD[0] = False  # while the handler awaits
    await trio.sleep(1)
    return Response.text("too late")


CALLS: list[str] = []  # calls of maybe_waits, and the waits it returned that ran


def maybe_waits(request: Request) -> Response | Awaitable[Response]:
    """A plain handler that answers at once, or returns what must be awaited (the script
    route: a reused boot at once, a new boot once committed)."""
    name = request.params["name"]
    CALLS.append(f"call {name}")
    if name.startswith("now"):
        return Response.text(f"now {name}")
    if name.startswith("fenced"):
        HELD[0] = False  # the lease lost between the handler's call and the task's turn

    async def later() -> Response:
        CALLS.append(f"waited {name}")
        await trio.sleep(1)
        return Response.text(f"later {name}")

    return later()


def router(root: Path) -> Router:
    builtin = builtin_routes(root)
    builtin.hot.fresh_seconds = 0  # kept at once (its ctime is the test's)
    return Router([Route("GET", "/text/{name}", text), Route("GET", "/slow/{name}", slowly),
                   Route("POST", "/echo", echo, max_body=100), Route("GET", "/framed", framed),
                   Route("GET", "/lease-lost", lease_lost),
                   Route("GET", "/maybe/{name}", maybe_waits),
                   Route("GET", "/files/{path:path}", static(root)), *builtin.files()])  # fmt: skip


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "small.bin").write_bytes(SMALL)
    (tmp_path / "big.bin").write_bytes(BIG)
    return tmp_path


class CountingLane(Lane):
    def __init__(self) -> None:
        super().__init__()
        self.parks = 0

    async def park(self, fd, serve):
        self.parks += 1
        return await super().park(fd, serve)


class Lab:
    def __init__(self, nursery: trio.Nursery, lane: CountingLane | None, root: Path) -> None:
        self.nursery, self.lane, self.router = nursery, lane, router(root)
        self.stats, self.access = Stats(), AccessLines()

    def connect(
        self, limits: Limits | None = None, guard=None
    ) -> tuple[Client, Connection, socket.socket]:
        client_sock, server_sock = trio.socket.socketpair()
        connection = Connection(
            trio.SocketStream(server_sock), self.router, limits or Limits(), self.stats, ("10.0.0.5", 1234),
            ("10.0.0.1", 80), self.access, guard, lane=self.lane,  # type: ignore[arg-type]
        )  # fmt: skip
        self.nursery.start_soon(connection.serve)
        return Client(trio.SocketStream(client_sock)), connection, server_sock


@contextlib.asynccontextmanager
async def lab(root: Path, with_lane: bool = True) -> AsyncIterator[Lab]:
    lane = CountingLane() if with_lane else None
    async with trio.open_nursery() as nursery:
        if lane is not None:
            await nursery.start(lane.run)
        yield Lab(nursery, lane, root)
        nursery.cancel_scope.cancel()
    if lane is not None:
        lane.close()


async def test_a_kept_alive_connection_is_answered_by_the_lane_not_its_task(root, autojump_clock):
    async with lab(root) as here:
        client, _, _ = here.connect()
        for n in range(30):
            reply = await client.request("GET", f"/text/{n}")
            assert (reply.status, reply.body) == (200, f"text {n}".encode())
            reply = await client.request("GET", "/boot/small.bin")
            assert (reply.status, reply.body) == (200, SMALL)
        assert here.lane.parks == 1  # its task waited once, and never woke
        assert here.lane.answered_parked >= 59  # the first one perhaps by the task, as it came
        assert [line["status"] for line in here.access.lines] == [200] * 60
        assert here.stats.requests[("GET", 200)] == 60


async def test_an_idle_connection_is_cut_idle_timeout_after_its_last_answer(root, autojump_clock):
    async with lab(root) as here:
        client, _, _ = here.connect(Limits(idle_timeout=60.0))
        for _ in range(3):
            assert (await client.request("GET", "/text/a")).status == 200
            await trio.sleep(50)  # each answer moves the deadline: still open
        assert (await client.request("GET", "/text/a")).status == 200
        answered = trio.current_time()
        assert await client.closed_by_server()
        assert trio.current_time() - answered == pytest.approx(60.0, abs=0.01)
        assert here.stats.timeouts["idle"] == 1 and not here.lane.parked


async def test_a_connection_that_sends_nothing_is_cut_at_the_request_deadline(root, autojump_clock):
    async with lab(root) as here:
        client, _, _ = here.connect(Limits(request_timeout=10.0))
        started = trio.current_time()
        assert await client.closed_by_server()
        assert trio.current_time() - started == pytest.approx(10.0, abs=0.01)
        assert here.stats.timeouts["request"] == 1


async def test_a_head_trickled_after_an_answer_is_cut_at_its_deadline(root, autojump_clock):
    async with lab(root) as here:
        client, _, _ = here.connect(Limits(request_timeout=10.0, idle_timeout=60.0))
        assert (await client.request("GET", "/text/a")).status == 200
        await trio.sleep(5)
        started = trio.current_time()
        with pytest.raises(trio.BrokenResourceError):
            for byte in CURL:  # a byte a second, from a parked connection: slowloris
                await client.send_raw(bytes([byte]))
                await trio.sleep(1)
        assert 10.0 <= trio.current_time() - started < 12.0
        assert here.stats.timeouts["request"] == 1


async def test_a_parked_connection_cancelled_leaves_the_lane_closed(root, autojump_clock):
    async with lab(root) as here:
        client_sock, server_sock = trio.socket.socketpair()
        connection = Connection(trio.SocketStream(server_sock), here.router, Limits(), here.stats,
                                ("10.0.0.5", 1), ("10.0.0.1", 80), False, lane=here.lane)  # fmt: skip
        client = Client(trio.SocketStream(client_sock))
        scope = trio.CancelScope()  # as a displacement cancels it
        here.nursery.start_soon(_run_in, scope, connection)
        assert (await client.request("GET", "/text/a")).status == 200
        await trio.testing.wait_all_tasks_blocked()
        assert len(here.lane.parked) == 1
        scope.cancel()
        assert await client.closed_by_server()
        assert not here.lane.parked


async def test_a_reset_seen_by_the_lane_ends_the_connection_quietly(root, autojump_clock):
    async with lab(root) as here:
        client, connection, _ = here.connect()
        assert (await client.request("GET", "/text/a")).status == 200
        await trio.testing.wait_all_tasks_blocked()
        await client.send_raw(b"GET /text/b HTTP/1.1\r\nhost: x\r\n\r\n")  # answered, unread
        await trio.testing.wait_all_tasks_blocked()
        client.stream.socket.close()  # with its answer unread: the lane's read is a reset
        await client.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert not here.lane.parked and here.lane.answered_parked == 1


async def _run_in(scope: trio.CancelScope, connection: Connection) -> None:
    with scope:
        await connection.serve()


async def test_what_the_lane_leaves_is_answered_by_the_task(root, autojump_clock):
    async with lab(root) as here:
        client, _, _ = here.connect()
        reply = await client.request("GET", "/slow/a")  # an async handler
        assert (reply.status, reply.body) == (200, b"slow a")
        reply = await client.request("POST", "/echo", body=b"hi")  # a body
        assert (reply.status, reply.body) == (200, b"got hi")
        reply = await client.request("GET", "/files/big.bin")  # sendfile, after a head of the lane
        assert (reply.status, reply.body) == (200, BIG)
        reply = await client.request("GET", "/files/big.bin", [("range", "bytes=5-9")])
        assert (reply.status, reply.body) == (206, BIG[5:10])
        reply = await client.request("GET", "/text/b")
        assert (reply.status, reply.body) == (200, b"text b")
        reply = await client.request("GET", "/text/c", [("connection", "close")])
        assert reply.status == 200 and reply.header(b"connection") == b"close"
        assert await client.closed_by_server()
        assert [line["status"] for line in here.access.lines] == [200, 200, 200, 206, 200, 200]


async def test_a_plain_handlers_wait_goes_to_the_task_and_runs_once(root, autojump_clock):
    """A plain handler's response is answered in the lane; what it returns to wait for is
    awaited by the connection's task, without calling the handler again."""
    CALLS.clear()
    async with lab(root) as here:
        client, _, _ = here.connect()
        assert (await client.request("GET", "/text/a")).status == 200  # now parked
        for n in range(3):
            reply = await client.request("GET", f"/maybe/now{n}")
            assert (reply.status, reply.body) == (200, f"now now{n}".encode())
        assert here.lane.parks == 1  # answered in the lane: the task never woke
        reply = await client.request("GET", "/maybe/wait")
        assert (reply.status, reply.body) == (200, b"later wait")
        assert here.lane.parks == 2  # handed to the task, then parked again
        assert (await client.request("GET", "/maybe/now3")).status == 200
        assert here.lane.parks == 2
        assert CALLS == ["call now0", "call now1", "call now2", "call wait", "waited wait",
                         "call now3"]  # fmt: skip
        assert [line["status"] for line in here.access.lines] == [200] * 6


async def test_a_wait_handed_over_when_the_lease_went_is_never_run(root, autojump_clock):
    """The task asks the fence again before it awaits what the handler returned: without
    the lease the wait is closed unrun (nothing it would write is written) and 503."""
    CALLS.clear()
    HELD[0] = True
    async with lab(root) as here:
        client, _, _ = here.connect(guard=lambda: HELD[0])
        assert (await client.request("GET", "/text/a")).status == 200  # now parked
        reply = await client.request("GET", "/maybe/fenced")
        assert reply.status == 503 and reply.header(b"connection") == b"close"
        assert await client.closed_by_server()
        assert CALLS == ["call fenced"] and here.stats.fenced == 1


async def test_an_answer_the_socket_cannot_take_at_once_is_finished_by_the_task(
    root, autojump_clock
):
    async with lab(root) as here:
        client, _, server_sock = here.connect()
        server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        (root / "sixty.bin").write_bytes(os.urandom(60 << 10))
        expected = (root / "sixty.bin").read_bytes()
        assert (await client.request("GET", "/text/a")).status == 200  # now parked
        for _ in range(3):
            reply = await client.request("GET", "/files/sixty.bin")
            assert (reply.status, reply.body) == (200, expected)
        assert here.lane.parks == 4  # each handed back to the task to finish, then parked again
        assert here.stats.bytes_sent == len(b"text a") + 3 * len(expected)


@pytest.mark.parametrize("target", ["/boot/small.bin", "/lease-lost"])
async def test_a_connection_to_the_vip_is_fenced_in_the_lane_too(root, autojump_clock, target):
    """Before the handler (the lane), or while an awaiting handler runs (the task, for a
    request it did not parse itself: h11 writes the 503 and the close)."""
    HELD[0] = True
    async with lab(root) as here:
        client, _, _ = here.connect(guard=lambda: HELD[0])
        assert (await client.request("GET", "/text/a")).status == 200
        assert (await client.request("GET", "/boot/small.bin")).status == 200
        HELD[0] = target == "/lease-lost"
        reply = await client.request("GET", target)
        assert reply.status == 503 and reply.header(b"connection") == b"close"
        assert await client.closed_by_server()
        assert here.stats.fenced == 1


async def test_a_kept_files_head_is_made_once_a_second(root, autojump_clock, monkeypatch):
    class Clock:
        date = b"Tue, 01 Dec 2026 10:00:00 GMT"

        def now(self) -> bytes:
            return self.date

    clock = Clock()
    monkeypatch.setattr(answering_module, "_date", clock)
    async with lab(root) as here:
        client, _, _ = here.connect()
        seen = []
        for date in [b"Tue, 01 Dec 2026 10:00:00 GMT"] * 2 + [b"Tue, 01 Dec 2026 10:00:01 GMT"]:
            clock.date = date
            for method in ("GET", "HEAD"):
                reply = await client.request(method, "/boot/small.bin")
                assert reply.status == 200 and reply.header(b"date") == date
                assert reply.body == (SMALL if method == "GET" else b"")
                assert reply.header(b"content-length") == b"%d" % len(SMALL)
                seen.append(reply.headers)
        assert seen[0] == seen[1] == seen[2] == seen[3] != seen[4]
        assert {k: v for k, v in seen[4].items() if k != b"date"} == {
            k: v for k, v in seen[0].items() if k != b"date"
        }


# -- the same bytes whichever way a request goes ----------------------------------------

_DATE = re.compile(rb"\r\ndate: [^\r]*\r\n")


async def _exchange(root: Path, data: bytes, with_lane: bool) -> tuple[bytes, list, dict]:
    """What a connection answers to ``data`` (then the client's end of stream): the bytes
    with the Date header blanked, the access lines and the request counters."""
    async with lab(root, with_lane) as here:
        client, _, _ = here.connect(Limits(request_timeout=5.0))
        if with_lane:  # parked first, as a kept-alive connection waits
            await trio.testing.wait_all_tasks_blocked()
        await client.send_raw(data)
        with contextlib.suppress(OSError):
            client.stream.socket.shutdown(socket.SHUT_WR)
        received = bytearray()
        with contextlib.suppress(trio.BrokenResourceError):
            while chunk := await client.stream.receive_some(1 << 16):
                received += chunk
        return (
            _DATE.sub(b"\r\ndate: -\r\n", bytes(received)),
            here.access.lines,
            dict(here.stats.requests),
        )


def _same_either_way(root: Path, data: bytes) -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    lane = trio.run(_exchange, root, data, True, clock=clock)
    h11_only = trio.run(
        _exchange, root, data, False, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert lane == h11_only, data


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])  # read only
@given(data=heads())
def test_the_lane_answers_what_h11_alone_answers(root, data):
    _same_either_way(root, data.replace(b"/boot/x?a=1", b"/boot/small.bin?a=1"))


@pytest.mark.parametrize(
    "data",
    [
        CURL.replace(b"/boot/small.bin", b"/boot/small.bin") * 3,
        CURL.replace(b"Accept: */*", b"Range: bytes=1-3"),
        CURL.replace(b"Accept: */*", b"If-None-Match: *"),
        CURL.replace(b"GET", b"HEAD") + CURL,
        CURL.replace(b"/boot/small.bin", b"/boot/../etc/passwd"),
        CURL.replace(b"/boot/small.bin", b"/boot/%2e%2e/x"),
        CURL.replace(b"/boot/small.bin", b"/boot/missing"),
        CURL.replace(b"/boot/small.bin", b"/echo"),  # 405
        CURL.replace(b"/boot/small.bin", b"/files/big.bin") + CURL,
        CURL.replace(b"/boot/small.bin", b"/slow/x") + CURL,
        CURL.replace(b"/boot/small.bin", b"/slow/x") + CURL.replace(b"GET", b"HEAD"),
        CURL.replace(b"/boot/small.bin", b"/framed") + CURL,
        CURL.replace(b"GET /boot/small.bin", b"HEAD /framed") + CURL,
        CURL.replace(b"/boot/small.bin", b"/slow/x") + b"GET /text/a HTTP/1.0\r\n\r\n",
        CURL + b"GET /text/a HTTP/1.0\r\n\r\n",
        CURL + CURL[:20],
    ],
)
def test_the_same_bytes_for_the_usual_and_the_unusual(root, data):
    _same_either_way(root, data)
