"""The node's side of the control socket (:mod:`appliance.control`): bind it, serve
each caller one request under a deadline, checked by ``SO_PEERCRED``."""

from __future__ import annotations

import inspect
import os
import socket
import struct
from typing import Any

import trio

from appliance.control import (
    MAX_REQUEST_BYTES,
    ControlRequestError,
    Handler,
    check_socket_path,
    parse_request_untrusted,
)
from appliance.errors import AlreadyRunning, RackbootError
from appliance.jsontext import dumps
from appliance.logs import get_logger

log = get_logger("control")


async def bind_control_socket(path: str) -> trio.socket.SocketType:
    """Bind the Unix socket, replacing a stale one but never a live node's."""
    check_socket_path(path)
    if os.path.exists(path):
        probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await probe.connect(path)
        except OSError:
            os.unlink(path)  # left behind by a node that died
        else:
            raise AlreadyRunning(f"another node answers on {path}")
        finally:
            probe.close()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await sock.bind(path)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(16)
    return sock


async def serve_control(
    sock: trio.socket.SocketType,
    handlers: dict[str, Handler],
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    listener = trio.SocketListener(sock)
    task_status.started()
    async with trio.open_nursery() as nursery:
        while True:
            stream = await listener.accept()
            nursery.start_soon(_serve_one, stream, handlers)


def _peer_uid(stream: trio.SocketStream) -> int | None:
    try:
        creds = stream.socket.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
        )
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


async def _serve_one(stream: trio.SocketStream, handlers: dict[str, Handler]) -> None:
    async with stream:
        response: dict[str, Any]
        with trio.move_on_after(10):
            try:
                uid = _peer_uid(stream)
                if uid not in (0, os.getuid()):
                    raise ControlRequestError("permission denied")
                line = await _read_line(stream, MAX_REQUEST_BYTES)
                cmd, args = parse_request_untrusted(line)
                handler = handlers.get(cmd)
                if handler is None:
                    raise ControlRequestError(
                        f"unknown command {cmd!r}; known: {', '.join(sorted(handlers))}"
                    )
                result = handler(args)
                if inspect.isawaitable(result):
                    result = await result
                response = {"ok": True, "result": result}
            except (ControlRequestError, RackbootError) as exc:
                response = {"ok": False, "error": str(exc)}
            except Exception as exc:  # a handler bug must not take the node down
                log.error("control command failed", error=f"{type(exc).__name__}: {exc}")
                response = {"ok": False, "error": f"internal error: {type(exc).__name__}"}
            try:
                payload = dumps(response).encode() + b"\n"
                await stream.send_all(payload)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


async def _read_line(stream: trio.SocketStream, cap: int) -> bytes:
    buf = bytearray()
    while b"\n" not in buf:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > cap:
            raise ControlRequestError(f"request larger than {cap} bytes")
    return bytes(buf.split(b"\n", 1)[0])
