"""Sending a region of an open file after a response head (trio shell).

On a plain TCP connection the file goes by ``os.sendfile`` straight from the
page cache to the socket: no copy through Python, no worker thread. The
socket is non-blocking; when it is full the task waits with
``trio.lowlevel.wait_writable``, and gives up when the client has taken
nothing for ``send_timeout`` seconds. Any other stream (TLS, a test's memory
stream) gets the file read in chunks by a worker thread and copied.

``sendfile`` reads pages the cache lacks in the calling thread, as nginx does
without ``aio``: boot files are read over and over and stay cached.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import trio

from .messages import FileRegion

SENDFILE_CHUNK = 8 << 20  # per call: bounds one call's time while a fast client drains
COPY_CHUNK = 256 << 10


class SendTimeout(Exception):
    """The client took no bytes for ``send_timeout`` seconds."""


class FileChanged(Exception):
    """The file ended before the bytes promised in Content-Length."""


async def send_head_and_file(
    stream: trio.abc.Stream,
    head: bytes,
    body: FileRegion,
    send_timeout: float,
    head_sent: Callable[[], None] | None = None,
) -> None:
    """Send ``head``, then ``body``; ``head_sent()`` once the head has left."""
    if isinstance(stream, trio.SocketStream):
        await _zero_copy(stream.socket, head, body, send_timeout, head_sent)
    else:
        await _copying(stream, head, body, send_timeout, head_sent)


async def _zero_copy(
    sock: trio.socket.SocketType,
    head: bytes,
    body: FileRegion,
    send_timeout: float,
    head_sent: Callable[[], None] | None,
) -> None:
    view = memoryview(head)
    while view:  # MSG_MORE: the head leaves in the same segment as the first file bytes
        with trio.move_on_after(send_timeout) as scope:
            sent = await sock.send(view, socket.MSG_MORE if body.count else 0)
        if scope.cancelled_caught:
            raise SendTimeout
        view = view[sent:]
    if head_sent is not None:
        head_sent()
    out, infd = sock.fileno(), body.handle.fileno()
    offset, remaining = body.offset, body.count
    while remaining:
        want = min(remaining, SENDFILE_CHUNK)
        try:
            sent = os.sendfile(out, infd, offset, want)
        except BlockingIOError:
            sent = -1
        if sent == 0:
            raise FileChanged
        if sent > 0:
            offset += sent
            remaining -= sent
        if sent == want:
            await trio.lowlevel.checkpoint()  # other connections get their turn
        elif remaining:
            # The socket is full: wait until the kernel says it has room (a good part of
            # the buffer, not the first free page), so each sendfile moves a large chunk.
            with trio.move_on_after(send_timeout) as scope:
                await trio.lowlevel.wait_writable(sock)
            if scope.cancelled_caught:
                raise SendTimeout from None


async def _copying(
    stream: trio.abc.Stream,
    head: bytes,
    body: FileRegion,
    send_timeout: float,
    head_sent: Callable[[], None] | None,
) -> None:
    infd = body.handle.fileno()
    offset, remaining, pending = body.offset, body.count, head
    while True:
        chunk = b""
        if remaining:
            chunk = await trio.to_thread.run_sync(
                os.pread, infd, min(remaining, COPY_CHUNK), offset
            )
            if not chunk:
                raise FileChanged
            offset += len(chunk)
            remaining -= len(chunk)
        with trio.move_on_after(send_timeout) as scope:
            await stream.send_all(pending + chunk if pending else chunk)
        if scope.cancelled_caught:
            raise SendTimeout
        if pending and head_sent is not None:
            head_sent()
        pending = b""
        if not remaining:
            return
