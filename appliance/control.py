"""The local control socket: one JSON request line in, one JSON response line out.

The socket lives in the data directory with mode 0600, and the server also
checks the caller's uid (``SO_PEERCRED``): only root and the node's own user
may talk to it. Requests are capped in size before they are decoded.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from appliance.errors import AlreadyRunning, RackbootError, Unreachable
from appliance.jsontext import dumps
from appliance.logs import get_logger

MAX_REQUEST_BYTES = 64 * 1024
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
SUN_PATH_MAX = 107

log = get_logger("control")

Handler = Callable[[dict[str, Any]], Any | Awaitable[Any]]


class ControlRequestError(Exception):
    """A request the server refuses; its text goes back to the client."""


def parse_request_untrusted(line: bytes) -> tuple[str, dict[str, Any]]:
    if len(line) > MAX_REQUEST_BYTES:
        raise ControlRequestError(f"request larger than {MAX_REQUEST_BYTES} bytes")
    try:
        request = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ControlRequestError("request is not JSON") from None
    if not isinstance(request, dict) or not isinstance(request.get("cmd"), str):
        raise ControlRequestError('request must be an object with a string "cmd"')
    args = request.get("args", {})
    if not isinstance(args, dict):
        raise ControlRequestError('"args" must be an object')
    return request["cmd"], args


def check_socket_path(path: str) -> None:
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise RackbootError(
            f"control socket path {path!r} is longer than {SUN_PATH_MAX} bytes; "
            "set node.control_socket to a shorter path"
        )


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


def call(path: str, cmd: str, args: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    """Blocking client used by the CLI. Raises :class:`Unreachable` when no node answers."""
    check_socket_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            reason = "no such socket" if exc.errno == errno.ENOENT else os.strerror(exc.errno or 0)
            raise Unreachable(
                f"no node answers on {path} ({reason}); is `rackboot run` running?"
            ) from None
        sock.sendall(dumps({"cmd": cmd, "args": args or {}}).encode() + b"\n")
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > MAX_RESPONSE_BYTES:
                raise Unreachable(f"response from {path} exceeds {MAX_RESPONSE_BYTES} bytes")
    except TimeoutError:
        raise Unreachable(f"node on {path} did not answer within {timeout} s") from None
    finally:
        sock.close()
    try:
        response = json.loads(buf)
    except ValueError:
        raise Unreachable(f"node on {path} sent a malformed response") from None
    if not response.get("ok"):
        raise RackbootError(f"node refused {cmd!r}: {response.get('error')}")
    return response.get("result")
