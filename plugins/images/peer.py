"""An HTTP/1.1 client for a peer's image routes (trio shell over h11).

One kept-alive connection per peer. A response body is read as it arrives,
never buffered whole: :meth:`Peer.get` yields the status and headers, then the
body in the pieces TCP delivers, so a run of chunks is checked and written as
it streams in. Every read has a deadline (``timeout`` seconds without a byte).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h11
import trio

RECEIVE = 256 * 1024
MAX_HEAD = 16 * 1024


class PeerError(Exception):
    """The peer could not be asked (connection, timeout, protocol): try another."""


class Response:
    def __init__(self, status: int, headers: dict[bytes, bytes], body: AsyncIterator[bytes]):
        self.status = status
        self.headers = headers
        self.body = body


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
        try:
            yield Response(event.status_code, dict(event.headers), self._body())
        except BaseException:
            await self.close()  # left mid-body: this connection cannot be reused
            raise
        if (
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
