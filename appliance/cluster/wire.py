"""Peer message framing (sans-IO): a 4-byte big-endian length, then one msgpack map.

The length is checked against the cap *before* the body is buffered or
decoded; the body is decoded by :func:`decode_untrusted` (no ext types,
string keys only, bounded containers) and checked against the message's
declared fields, so a shell never sees a message of the wrong shape.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

HEADER = struct.Struct(">I")
DEFAULT_MAX_MESSAGE = 1024 * 1024

# type -> {field: python type(s)}; every field is required, extra fields are ignored
# (a newer peer may add some). bytes fields carry DER blobs.
MESSAGES: dict[str, dict[str, type | tuple[type, ...]]] = {
    "hello": {
        "proto_min": int,
        "proto_max": int,
        "version": str,
        "cluster": str,
        "node": str,
        "name": str,
        "rack": str,
        "role": str,
        "addr": str,
        "crl": int,
    },  # fmt: skip
    "refuse": {"reason": str},
    "ping": {"n": int, "role": str},
    "pong": {"n": int},
    "crl": {"der": bytes},
    # requests between nodes (cluster protocol 2): args and result are checked by the
    # command that takes them
    "call": {"id": int, "cmd": str, "args": dict},
    "reply": {"id": int, "ok": bool, "error": str, "result": object},
    # enrolment (a node without a certificate, over server-authenticated TLS)
    "enrol-hello": {"version": str},
    "enrol-ca": {"ca": bytes},
    "enrol": {"token": bytes, "secret": bytes, "csr": bytes, "name": str, "rack": str},
    "enrolled": {"cert": bytes, "node": str, "crl": bytes},
}


class FrameError(Exception):
    """Bytes that are not a valid message; the connection that sent them is closed."""


class MessageTooLarge(FrameError):
    pass


def encode(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def _no_ext(code: int, data: bytes) -> Any:
    raise FrameError(f"msgpack extension type {code} is not allowed")


def decode_untrusted(body: bytes, max_size: int = DEFAULT_MAX_MESSAGE) -> dict[str, Any]:
    """One message body -> a validated message dict, or :class:`FrameError`."""
    if len(body) > max_size:
        raise MessageTooLarge(f"message of {len(body)} bytes exceeds the cap of {max_size}")
    try:
        message = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            ext_hook=_no_ext,
            use_list=True,
            max_array_len=4096,
            max_map_len=256,
        )  # fmt: skip
    except FrameError:
        raise
    except Exception as exc:  # msgpack raises ValueError, ExtraData, UnpackValueError, ...
        raise FrameError(f"message is not valid msgpack ({type(exc).__name__})") from None
    return validate_untrusted(message)


def validate_untrusted(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise FrameError("message is not a map")
    kind = message.get("t")
    spec = MESSAGES.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise FrameError(f"unknown message type {kind!r}")
    for name, types in spec.items():
        value = message.get(name)
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            raise FrameError(f"{kind} message: field {name!r} missing or of the wrong type")
    return message


class FrameReader:
    """Reassembles messages from a byte stream; never buffers more than one capped message."""

    def __init__(self, max_size: int = DEFAULT_MAX_MESSAGE) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Append ``data``; return the complete messages. Raises :class:`FrameError`."""
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buf)
            if length > self.max_size:
                raise MessageTooLarge(
                    f"message of {length} bytes announced, the cap is {self.max_size}"
                )
            if len(self._buf) < HEADER.size + length:
                break
            body = bytes(self._buf[HEADER.size : HEADER.size + length])
            del self._buf[: HEADER.size + length]
            out.append(decode_untrusted(body, self.max_size))
        return out

    def wanted(self) -> int:
        """How many bytes the shell may read next without exceeding one message."""
        if len(self._buf) < HEADER.size:
            return HEADER.size - len(self._buf)
        (length,) = HEADER.unpack_from(self._buf)
        return max(1, min(length, self.max_size) + HEADER.size - len(self._buf))
