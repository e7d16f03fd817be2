"""DHCPv4 option codes and typed option values (RFC 2132 and friends), sans-IO.

Options travel as raw ``bytes`` in :class:`plugins.dhcp.codec.Message`; the
functions here turn values into bytes (``encode_*``, raising :class:`EncodeError`
on values that cannot be encoded) and back (``decode_*``, raising
:class:`MalformedPacket` on bytes of the wrong shape: option values come from the
network, so a decoder failure is a reason to drop the packet, not a bug).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Network


class MalformedPacket(ValueError):
    """The only exception a ``*_untrusted`` parser or a ``decode_*`` function raises.

    ``reason`` is a short stable token (``"truncated-option"``, ``"bad-cookie"``...)
    for counting drops by reason; ``str(error)`` adds the details.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class EncodeError(ValueError):
    """A value or message that cannot be put on the wire (a bug or bad config, not bad input)."""


class Opt(enum.IntEnum):
    PAD = 0
    SUBNET_MASK = 1
    ROUTER = 3
    DNS_SERVERS = 6
    HOSTNAME = 12
    DOMAIN_NAME = 15
    INTERFACE_MTU = 26
    BROADCAST_ADDRESS = 28
    NTP_SERVERS = 42
    VENDOR_SPECIFIC = 43
    REQUESTED_IP = 50
    LEASE_TIME = 51
    OVERLOAD = 52
    MESSAGE_TYPE = 53
    SERVER_ID = 54
    PARAMETER_REQUEST_LIST = 55
    MESSAGE = 56
    MAX_MESSAGE_SIZE = 57
    RENEWAL_TIME = 58  # T1
    REBINDING_TIME = 59  # T2
    VENDOR_CLASS = 60
    CLIENT_ID = 61
    TFTP_SERVER_NAME = 66
    BOOTFILE_NAME = 67
    USER_CLASS = 77  # RFC 3004
    RELAY_AGENT_INFO = 82  # RFC 3046: kept and echoed as opaque bytes
    CLIENT_ARCH = 93  # RFC 4578
    CLIENT_NDI = 94  # RFC 4578
    CLIENT_UUID = 97  # RFC 4578: type 0 + 16 bytes (SMBIOS byte order in practice)
    SUBNET_SELECTION = 118  # RFC 3011; the relay-side variant is sub-option 5 of 82 (RFC 3527)
    DOMAIN_SEARCH = 119  # RFC 3397
    CLASSLESS_STATIC_ROUTES = 121  # RFC 3442
    IPXE_ENCAPSULATED = 175  # iPXE feature flags
    PXELINUX_MAGIC = 208  # RFC 5071
    PXELINUX_CONFIG_FILE = 209
    PXELINUX_PATH_PREFIX = 210
    PXELINUX_REBOOT_TIME = 211
    END = 255


class MessageType(enum.IntEnum):
    DISCOVER = 1
    OFFER = 2
    REQUEST = 3
    DECLINE = 4
    ACK = 5
    NAK = 6
    RELEASE = 7
    INFORM = 8
    FORCERENEW = 9  # RFC 3203; 10-18: leasequery (RFC 4388, 6926, 7724)
    LEASEQUERY = 10
    LEASEUNASSIGNED = 11
    LEASEUNKNOWN = 12
    LEASEACTIVE = 13
    BULKLEASEQUERY = 14
    LEASEQUERYDONE = 15
    ACTIVELEASEQUERY = 16
    LEASEQUERYSTATUS = 17
    TLS = 18


# Lengths of the options Message's accessors decode: (minimum, maximum, multiple of).
# parse_untrusted rejects a packet breaking them and build refuses to emit one, so the
# accessors never fail. Everything else stays opaque until someone decodes it.
VALUE_LENGTHS: dict[int, tuple[int, int, int]] = {
    Opt.REQUESTED_IP: (4, 4, 1),
    Opt.LEASE_TIME: (4, 4, 1),
    Opt.MESSAGE_TYPE: (1, 1, 1),
    Opt.SERVER_ID: (4, 4, 1),
    Opt.MAX_MESSAGE_SIZE: (2, 2, 1),
    Opt.CLIENT_ID: (2, 1 << 16, 1),  # RFC 2132 §9.14: at least type + one byte
    Opt.CLIENT_ARCH: (2, 1 << 16, 2),
    Opt.SUBNET_SELECTION: (4, 4, 1),
}

_U8, _U16, _U32 = struct.Struct("!B"), struct.Struct("!H"), struct.Struct("!I")


def _bad(what: str, value: bytes) -> MalformedPacket:
    return MalformedPacket("bad-option-value", f"{what}: {value[:32].hex()} ({len(value)} bytes)")


def _pack(fmt: struct.Struct, n: int) -> bytes:
    try:
        return fmt.pack(n)
    except struct.error as e:
        raise EncodeError(f"{n!r} does not fit in {fmt.size} byte(s)") from e


def _unpack(fmt: struct.Struct, value: bytes) -> int:
    if len(value) != fmt.size:
        raise _bad(f"expected {fmt.size} bytes", value)
    return fmt.unpack(value)[0]


def encode_u8(n: int) -> bytes:
    return _pack(_U8, n)


def encode_u16(n: int) -> bytes:
    return _pack(_U16, n)


def encode_u32(n: int) -> bytes:
    return _pack(_U32, n)


def decode_u8(value: bytes) -> int:
    return _unpack(_U8, value)


def decode_u16(value: bytes) -> int:
    return _unpack(_U16, value)


def decode_u32(value: bytes) -> int:
    return _unpack(_U32, value)


def _address(addr: IPv4Address | str | int) -> IPv4Address:
    try:
        return IPv4Address(addr)
    except ValueError as e:
        raise EncodeError(str(e)) from e


def encode_ip(addr: IPv4Address | str | int) -> bytes:
    return _address(addr).packed


def decode_ip(value: bytes) -> IPv4Address:
    if len(value) != 4:
        raise _bad("an address is 4 bytes", value)
    return IPv4Address(value)


def encode_ips(addrs: Iterable[IPv4Address | str | int]) -> bytes:
    return b"".join(_address(a).packed for a in addrs)


def decode_ips(value: bytes) -> list[IPv4Address]:
    if not value or len(value) % 4:
        raise _bad("an address list is a non-empty multiple of 4 bytes", value)
    return [IPv4Address(value[i : i + 4]) for i in range(0, len(value), 4)]


def encode_str(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def decode_str(value: bytes) -> str:
    """Any bytes map to a str and back; a trailing NUL, which some clients add, is dropped."""
    return value.rstrip(b"\0").decode("utf-8", "surrogateescape")


def encode_routes(routes: Iterable[tuple[IPv4Network | str, IPv4Address | str]]) -> bytes:
    """RFC 3442: width, the significant octets of the destination, then the router."""
    out = bytearray()
    for destination, router in routes:
        try:
            net = IPv4Network(destination)
        except ValueError as e:
            raise EncodeError(str(e)) from e
        width = net.prefixlen
        out.append(width)
        out += net.network_address.packed[: (width + 7) // 8]
        out += encode_ip(router)
    return bytes(out)


def decode_routes(value: bytes) -> list[tuple[IPv4Network, IPv4Address]]:
    """RFC 3442; destination bits beyond the width are ignored, as the RFC's clients do."""
    if len(value) < 5:
        raise _bad("classless routes need at least 5 bytes", value)
    routes, i = [], 0
    while i < len(value):
        width = value[i]
        if width > 32:
            raise _bad(f"route width {width} > 32", value)
        end = i + 1 + (width + 7) // 8
        if end + 4 > len(value):
            raise _bad("truncated classless route", value)
        destination = IPv4Address(value[i + 1 : end].ljust(4, b"\0"))
        routes.append(
            (IPv4Network((destination, width), strict=False), IPv4Address(value[end : end + 4]))
        )
        i = end + 4
    return routes


def encode_client_arches(arches: Iterable[int]) -> bytes:
    return b"".join(encode_u16(a) for a in arches)


def decode_client_arches(value: bytes) -> list[int]:
    """RFC 4578 option 93: a list of 16-bit architecture types."""
    if not value or len(value) % 2:
        raise _bad("client architectures are a non-empty multiple of 2 bytes", value)
    return [int.from_bytes(value[i : i + 2], "big") for i in range(0, len(value), 2)]


def encode_user_classes(classes: Iterable[bytes]) -> bytes:
    """RFC 3004 form: each class as length + data."""
    out = bytearray()
    for cls in classes:
        if not 1 <= len(cls) <= 255:
            raise EncodeError(f"a user class is 1..255 bytes, not {len(cls)}")
        out.append(len(cls))
        out += cls
    return bytes(out)


def decode_user_classes(value: bytes) -> list[bytes]:
    """RFC 3004 classes, or the whole value as one class when it is not in that form.

    iPXE and many PXE stacks send the bare string (``b"iPXE"``), which never parses
    as RFC 3004 (its first byte, as a length, overruns the value), so both forms
    read the same: ``b"iPXE" in decode_user_classes(v)``.
    """
    classes, i = [], 0
    while i < len(value):
        n = value[i]
        if n == 0 or i + 1 + n > len(value):
            return [value]
        classes.append(value[i + 1 : i + 1 + n])
        i += 1 + n
    return classes


def encode_param_request_list(codes: Iterable[int]) -> bytes:
    try:
        return bytes(codes)
    except ValueError as e:
        raise EncodeError(f"option codes are 0..255: {e}") from e


def decode_param_request_list(value: bytes) -> list[int]:
    return list(value)
