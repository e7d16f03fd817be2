"""TFTP packet codec (RFC 1350, options per RFC 2347).

Our own ``struct`` codec rather than tftpy's: tftpy raises struct.error,
UnicodeDecodeError, AssertionError or TftpException on bad bytes, rejects
non-ASCII file names and empty option values, keeps the last of duplicate
options and scans byte by byte; wrapping it would take more code than this.

Strings are NUL-terminated. File names are decoded like ``os.fsdecode`` (UTF-8
with ``surrogateescape``), so any byte sequence maps back to the same bytes on
the filesystem; mode and option strings must be ASCII. Mode and option names are
lower-cased; a duplicate option name makes the packet malformed.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_BLKSIZE = 65464  # RFC 2348
MAX_PACKET = 4 + MAX_BLKSIZE  # the largest legal datagram: DATA at the largest blksize
MAX_REQUEST = 512  # RFC 2347: a request, options included, fits in 512 octets
TRANSFER_MODES = frozenset({"octet", "netascii"})  # "mail" is obsolete: the shell refuses it

_HH = struct.Struct("!HH")
_H = struct.Struct("!H")


class Opcode(enum.IntEnum):
    RRQ = 1
    WRQ = 2
    DATA = 3
    ACK = 4
    ERROR = 5
    OACK = 6


class ErrorCode(enum.IntEnum):
    NOT_DEFINED = 0
    FILE_NOT_FOUND = 1
    ACCESS_VIOLATION = 2
    DISK_FULL = 3
    ILLEGAL_OPERATION = 4
    UNKNOWN_TID = 5
    FILE_EXISTS = 6
    NO_SUCH_USER = 7
    OPTION_REFUSED = 8  # RFC 2347


# The hot encoders' opcodes as plain ints: an IntEnum member lookup costs ~190 ns on 3.11.
_DATA, _ACK, _ERROR, _OACK = int(Opcode.DATA), int(Opcode.ACK), int(Opcode.ERROR), int(Opcode.OACK)


class MalformedPacket(ValueError):
    """The only exception :func:`parse_untrusted` raises."""


@dataclass(frozen=True, slots=True)
class Request:
    opcode: Opcode  # RRQ or WRQ
    filename: str  # surrogate-escaped: os.fsencode(filename) gives the bytes sent
    mode: str  # lower-cased, not checked against TRANSFER_MODES
    options: dict[str, str] = field(default_factory=dict)  # lower-cased names, in order


@dataclass(frozen=True, slots=True)
class Data:
    block: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    block: int


@dataclass(frozen=True, slots=True)
class Error:
    code: int  # an ErrorCode value, or whatever 16-bit number the peer sent
    message: str


@dataclass(frozen=True, slots=True)
class OptionAck:
    options: dict[str, str]


Packet = Request | Data | Ack | Error | OptionAck


def _ascii(raw: bytes, what: str) -> str:
    if not raw.isascii():
        raise MalformedPacket(f"non-ASCII {what}")
    return raw.decode("ascii")


def _options(fields: list[bytes]) -> dict[str, str]:
    if len(fields) % 2:
        raise MalformedPacket("option without a value")
    options: dict[str, str] = {}
    for name_raw, value_raw in zip(fields[::2], fields[1::2], strict=True):
        name = _ascii(name_raw, "option name").lower()
        if not name:
            raise MalformedPacket("empty option name")
        if name in options:
            raise MalformedPacket(f"duplicate option {name!r}")
        options[name] = _ascii(value_raw, "option value")
    return options


def _strings(body: bytes) -> list[bytes]:
    if not body.endswith(b"\0"):
        raise MalformedPacket("string not NUL-terminated")
    return body[:-1].split(b"\0")


def parse_untrusted(data: bytes) -> Packet:
    """Decode one datagram; :class:`MalformedPacket` on anything else."""
    if len(data) < 4:
        raise MalformedPacket("shorter than any TFTP packet")
    if len(data) > MAX_PACKET:
        raise MalformedPacket("longer than any TFTP packet")
    opcode, number = _HH.unpack_from(data)
    if opcode in (Opcode.RRQ, Opcode.WRQ):
        if len(data) > MAX_REQUEST:
            raise MalformedPacket("request longer than 512 octets")
        fields = _strings(data[2:])
        if len(fields) < 2:
            raise MalformedPacket("request without a mode")
        filename = fields[0].decode("utf-8", "surrogateescape")
        mode = _ascii(fields[1], "mode").lower()
        rest = fields[2:]
        if not any(rest):  # trailing NUL padding, as some PXE ROMs send: no options
            rest = []
        return Request(Opcode(opcode), filename, mode, _options(rest))
    if opcode == Opcode.DATA:
        return Data(number, bytes(data[4:]))
    if opcode == Opcode.ACK:
        return Ack(number)  # trailing bytes ignored, as tftpd-hpa does
    if opcode == Opcode.ERROR:
        # A missing terminator is tolerated: the message is diagnostic text only.
        message = bytes(data[4:]).split(b"\0", 1)[0]
        return Error(number, message.decode("ascii", "replace"))
    if opcode == Opcode.OACK:
        return OptionAck(_options(_strings(data[2:])))
    raise MalformedPacket(f"unknown opcode {opcode}")


def _cstring(text: str, encoding: str = "ascii", errors: str = "strict") -> bytes:
    raw = text.encode(encoding, errors)
    if b"\0" in raw:
        raise ValueError("NUL inside a TFTP string")
    return raw + b"\0"


def _encode_options(options: Mapping[str, str]) -> bytes:
    return b"".join(_cstring(k) + _cstring(str(v)) for k, v in options.items())


def encode_request(
    opcode: Opcode, filename: str, mode: str = "octet", options: Mapping[str, str] | None = None
) -> bytes:
    """An RRQ or WRQ (used by test clients; the server never sends one)."""
    if opcode not in (Opcode.RRQ, Opcode.WRQ):
        raise ValueError("a request is an RRQ or a WRQ")
    return (
        _H.pack(opcode)
        + _cstring(filename, "utf-8", "surrogateescape")
        + _cstring(mode)
        + _encode_options(options or {})
    )


def encode_data(block: int, payload: bytes | memoryview) -> bytes:
    return _HH.pack(_DATA, block) + payload


def encode_ack(block: int) -> bytes:
    return _HH.pack(_ACK, block)


def encode_error(code: int, message: str) -> bytes:
    # Messages may quote surrogate-escaped client names: escape, never fail.
    return _HH.pack(_ERROR, code) + _cstring(message.replace("\0", ""), "ascii", "backslashreplace")


def encode_oack(options: Mapping[str, str]) -> bytes:
    return _H.pack(_OACK) + _encode_options(options)
