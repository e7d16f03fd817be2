"""An HTTP/1.1 client for a peer's image routes (trio shell over h11).

One kept-alive connection per peer. A response body is read as it arrives,
never buffered whole: :meth:`Peer.request` yields the status and headers, then
the body in the pieces TCP delivers; or :meth:`Peer.write_body` moves it from
the socket into a file with ``splice(2)`` (through a pipe, never through
Python: one kernel copy instead of a receive and a write, the receiver's CPU
being what limits a sync). Every read has a deadline (``timeout`` seconds
without a byte).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h11
import trio

RECEIVE = 256 * 1024
MAX_HEAD = 16 * 1024
PIPE_SIZE = 1 << 20  # bytes per splice: the default pipe (64 KiB) costs 16x the calls
F_SETPIPE_SZ = 1031


class PeerError(Exception):
    """The peer could not be asked (connection, timeout, protocol): try another."""


class Response:
    def __init__(self, status: int, headers: dict[bytes, bytes], body: AsyncIterator[bytes]):
        self.status = status
        self.headers = headers
        self.body = body
        self.written = False  # the body went to a file (Peer.write_body), not through h11

    @property
    def length(self) -> int | None:
        """The Content-Length, when the peer sent a valid one."""
        value = self.headers.get(b"content-length", b"")
        return int(value) if value.isdigit() and len(value) < 20 else None


class Peer:
    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.stream: trio.SocketStream | None = None
        self.h11: h11.Connection | None = None
        self.received = 0  # bytes read from the socket (bodies and heads)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @asynccontextmanager
    async def request(
        self, method: str, target: str, headers: list[tuple[str, str]] = (), *, body: bytes = b""
    ) -> AsyncIterator[Response]:
        """``method target`` with ``body``. Read the response body to its end to keep the
        connection; its iterator raises :class:`PeerError` when the peer fails mid-way."""
        async with self._io():
            if self.stream is None or self.h11 is None or self.h11.our_state is not h11.IDLE:
                await self._connect()
            assert self.h11 is not None
            sized = [("content-length", str(len(body)))] if method != "GET" else []
            await self._send(h11.Request(method=method, target=target,
                                         headers=[("host", str(self)), *sized, *headers]))  # fmt: skip
            if body:
                await self._send(h11.Data(data=body))
            await self._send(h11.EndOfMessage())
            event = await self._next()
            if not isinstance(event, h11.Response):
                raise PeerError(f"{self}: expected a response, got {type(event).__name__}")
        response = Response(event.status_code, dict(event.headers), self._body())
        try:
            yield response
        except BaseException:
            await self.close()  # left mid-body: this connection cannot be reused
            raise
        if response.written:  # h11 never saw the body: a fresh one for the next request
            self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        elif (
            self.h11 is not None
            and self.h11.their_state is h11.DONE
            and (self.h11.our_state is h11.DONE)
        ):
            self.h11.start_next_cycle()
        else:
            await self.close()

    @asynccontextmanager
    async def _io(self) -> AsyncIterator[None]:
        """The peer's failures as :class:`PeerError` (the connection closed)."""
        try:
            yield
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError,
                trio.TooSlowError) as exc:  # fmt: skip
            await self.close()
            raise PeerError(f"{self}: {type(exc).__name__}: {exc}") from None

    async def write_body(self, response: Response, fd: int, offset: int) -> AsyncIterator[int]:
        """Write the body of ``response`` (all its Content-Length bytes) to ``fd`` at
        ``offset`` as it arrives, yielding how many bytes of it are in the file so far.
        Read it to its end to keep the connection."""
        length = response.length
        assert self.h11 is not None and self.stream is not None and length is not None
        early, _ = self.h11.trailing_data  # the body's first bytes, read with the head
        if len(early) > length:
            raise PeerError(f"{self}: sent more than its Content-Length")
        response.written = True
        done = 0
        if early:
            done = _pwrite_all(fd, early, offset)
            yield done
        sock = self.stream.socket.fileno()
        pipe_r, pipe_w = os.pipe2(os.O_CLOEXEC)
        try:
            fcntl.fcntl(pipe_w, F_SETPIPE_SZ, PIPE_SIZE)
            while done < length:
                async with self._io():
                    try:
                        n = os.splice(sock, pipe_w, min(PIPE_SIZE, length - done),
                                      flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK)  # fmt: skip
                    except BlockingIOError:
                        with trio.fail_after(self.timeout):
                            await trio.lowlevel.wait_readable(sock)
                        continue
                if n == 0:
                    await self.close()
                    raise PeerError(f"{self}: closed the connection mid-body")
                self.received += n
                _drain(pipe_r, fd, n, offset + done)
                done += n
                yield done
        finally:
            os.close(pipe_r)
            os.close(pipe_w)

    async def _body(self) -> AsyncIterator[bytes]:
        while True:
            async with self._io():
                event = await self._next()
            if isinstance(event, h11.Data):
                yield event.data  # h11's own slice of its buffer: no copy here
            elif isinstance(event, h11.EndOfMessage):
                return
            else:
                raise PeerError(f"{self}: unexpected {type(event).__name__} in a body")

    async def _connect(self) -> None:
        await self.close()
        with trio.fail_after(self.timeout):
            self.stream = await trio.open_tcp_stream(self.host, self.port)
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)

    async def _send(self, event) -> None:
        assert self.h11 is not None and self.stream is not None
        data = self.h11.send(event)
        if data:
            with trio.fail_after(self.timeout):
                await self.stream.send_all(data)

    async def _next(self):
        assert self.h11 is not None and self.stream is not None
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                if isinstance(event, h11.ConnectionClosed):
                    raise PeerError(f"{self}: closed the connection")
                return event
            with trio.fail_after(self.timeout):
                data = await self.stream.receive_some(RECEIVE)
            self.received += len(data)
            self.h11.receive_data(data)

    async def close(self) -> None:
        if self.stream is not None:
            stream, self.stream, self.h11 = self.stream, None, None
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()


def _pwrite_all(fd: int, data: bytes, offset: int) -> int:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
    return len(data)


def _drain(pipe: int, fd: int, n: int, offset: int) -> None:
    """Move ``n`` bytes from ``pipe`` to ``fd`` at ``offset`` (a file system that cannot
    splice gets them through a read and a write)."""
    while n:
        try:
            moved = os.splice(pipe, fd, n, offset_dst=offset, flags=os.SPLICE_F_MOVE)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            moved = _pwrite_all(fd, os.read(pipe, n), offset)
        n, offset = n - moved, offset + moved
