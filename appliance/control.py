"""The local control socket: one JSON request line in, one JSON response line out.

This module is the protocol and the CLI's blocking client (no trio: the CLI answers
at once); the node's trio server is :mod:`appliance.controlserver`.

The socket lives in the data directory with mode 0600, and the server also
checks the caller's uid (``SO_PEERCRED``): only root and the node's own user
may talk to it. Requests are capped in size before they are decoded.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from appliance.errors import RackbootError, Unreachable
from appliance.jsontext import dumps

MAX_REQUEST_BYTES = 64 * 1024
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
SUN_PATH_MAX = 107

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
