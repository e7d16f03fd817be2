"""A small HTTP/1.1 test client on trio (h11), for the httpboot shell tests.

It speaks over any trio stream: real loopback sockets (the server's sendfile path)
or trio's in-memory streams (the copying path, on the autojump clock). Raw bytes can
be sent as they are, for requests a well-behaved client would never make.
"""

from __future__ import annotations

from dataclasses import dataclass

import h11
import trio

Address = tuple[str, int]


@dataclass
class Reply:
    status: int
    headers: dict[bytes, bytes]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        return self.headers.get(name)


class Client:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, address: Address) -> Client:
        return cls(await trio.open_tcp_stream(*address))

    async def request(
        self,
        method: str,
        target: str | bytes,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> Reply:
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        target = target.encode() if isinstance(target, str) else target
        all_headers = [("host", "test"), *(headers or [])]
        if body or method in ("POST", "PUT"):
            all_headers.append(("content-length", str(len(body))))
        data = self.h11.send(h11.Request(method=method, target=target, headers=all_headers))
        if body:
            data += self.h11.send(h11.Data(data=body))
        data += self.h11.send(h11.EndOfMessage())
        await self.stream.send_all(data)
        return await self.reply()

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def reply(self) -> Reply:
        """The next response (interim 1xx responses skipped)."""
        response, body = None, bytearray()
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(1 << 20))
                continue
            if event is h11.PAUSED:  # would spin here without an await: no timeout ends it
                raise RuntimeError("the previous exchange is over: call start_next_cycle first")
            if isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return Reply(response.status_code, dict(response.headers), bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                raise EOFError("the server closed the connection")

    async def closed_by_server(self) -> bool:
        """Whether the server closes the connection (end of stream) rather than sending."""
        try:
            return await self.stream.receive_some(1) == b""
        except trio.BrokenResourceError:
            return True

    async def aclose(self) -> None:
        await self.stream.aclose()


async def fetch(address: Address, method: str, target: str | bytes, **kw) -> Reply:
    client = await Client.connect(address)
    try:
        return await client.request(method, target, **kw)
    finally:
        await client.aclose()


async def raw_exchange(address: Address, data: bytes, limit: int = 1 << 16) -> bytes:
    """Send ``data`` as is and read until the server closes (or ``limit`` bytes)."""
    stream = await trio.open_tcp_stream(*address)
    try:
        await stream.send_all(data)
        out = bytearray()
        while len(out) < limit:
            try:
                chunk = await stream.receive_some(limit)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            out += chunk
        return bytes(out)
    finally:
        await stream.aclose()
