"""BOOTP/DHCPv4 messages on the wire (RFC 2131, RFC 3396), sans-IO, with ``struct``.

:func:`parse_untrusted` raises nothing but :class:`MalformedPacket`, whose
``reason`` names the rule broken. Its decisions:

* The size cap (:data:`MAX_PACKET`) is checked first, then the 236-byte header
  and the magic cookie. BOOTP without the cookie (RFC 951 vendor area) is
  rejected as ``bad-cookie``: PXE ROMs and DHCP clients always send it, and a
  pure-BOOTP client would need replies of another form.
* ``op`` must be 1 or 2 and ``hlen`` at most 16.
* PAD is skipped, END stops a field, bytes after END are ignored. A missing END
  is tolerated when the last option ends exactly at the end of its field (ISC
  dhcpd's parser does the same); an option whose length runs past its field is ``truncated-option``.
* Option overload (52, options field only) continues the options in ``file``
  (1), ``sname`` (2) or both (3), read in the RFC 3396 order options, file,
  sname. Those fields then read as empty, and 52 itself is not kept.
* Repeated options are concatenated in the order read (RFC 3396); more than
  :data:`MAX_REPEATS` repeated instances are ``too-many-options``. With only 254
  codes, that bounds the work on any packet (~1 ms at worst, ~5 µs typical). Unknown
  options are kept as bytes; the ones the accessors decode must have the
  lengths in :data:`~plugins.dhcp.options.VALUE_LENGTHS` and option 53 a known
  :class:`MessageType`, so the accessors never fail on a parsed message.

:func:`build` is the inverse; see its docstring for ordering and overload.
"""

from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass, field
from ipaddress import IPv4Address

from .options import (
    VALUE_LENGTHS,
    EncodeError,
    MalformedPacket,
    MessageType,
    Opt,
    decode_client_arches,
    decode_str,
    decode_user_classes,
)

__all__ = [
    "MAX_PACKET",
    "MAX_REPEATS",
    "REASONS",
    "EncodeError",
    "MalformedPacket",
    "Message",
    "build",
    "build_prepared",
    "option_block",
    "parse_untrusted",
]

BOOTREQUEST, BOOTREPLY = 1, 2
MAGIC_COOKIE = b"\x63\x82\x53\x63"
MAX_PACKET = 65_535  # checked before anything else is read
MAX_REPEATS = 1024  # repeated option instances; a 64 KiB value in 255-byte pieces needs 257
REASONS = frozenset(  # every MalformedPacket.reason parse_untrusted gives, for drop counters
    {
        "too-large", "too-short", "bad-cookie", "bad-op", "bad-hlen", "truncated-option",
        "too-many-options", "bad-overload", "bad-option-length", "bad-message-type",
    }
)  # fmt: skip
MIN_MESSAGE = 240  # fixed header + cookie
MIN_BOOTP = 300  # RFC 951 length; some PXE ROMs drop shorter replies
MIN_MAX_SIZE = 576  # RFC 2131 §2: every client takes a 576-byte IP datagram
IP_UDP_HEADERS = 28
BROADCAST_FLAG = 0x8000
SNAME_AT, FILE_AT, OPTIONS_AT = 44, 108, 240

_HEADER = struct.Struct("!4BIHH4I16s64s128s4s")
_FIXED = struct.Struct("!4BIHH4I16s")  # what build packs itself: up to chaddr
_EMPTY_FIELDS = bytes(64 + 128) + MAGIC_COOKIE  # sname and file empty, then the cookie
_TL = struct.Struct("BB").pack
_NOT_PAD = re.compile(b"[^\x00]")
_ZERO = IPv4Address(0)
_address = functools.lru_cache(maxsize=4096)(IPv4Address)  # 0.1 µs instead of 0.3-0.4
# Plain ints on the hot paths: an IntEnum attribute lookup costs ~0.2 µs on 3.11.
_OVERLOAD, _MESSAGE_TYPE = int(Opt.OVERLOAD), int(Opt.MESSAGE_TYPE)
_FIRST, _LAST = (_MESSAGE_TYPE, int(Opt.SERVER_ID)), int(Opt.RELAY_AGENT_INFO)
_LENGTH_RULES = tuple((int(code), rule) for code, rule in VALUE_LENGTHS.items())
_RULED = frozenset(code for code, _ in _LENGTH_RULES)
_SETTABLE = frozenset(range(1, 255)) - {_OVERLOAD}
_BYTES = frozenset({bytes})
_MAX_TYPE = int(max(MessageType))
_MESSAGE_TYPES = (None, *MessageType)  # by value: a tuple index beats MessageType(n) 4x


@dataclass(slots=True)
class Message:
    """One BOOTP/DHCP message; ``options`` maps code to the raw, concatenated value."""

    op: int = BOOTREQUEST
    htype: int = 1
    hlen: int = 6
    hops: int = 0
    xid: int = 0
    secs: int = 0
    flags: int = 0
    ciaddr: IPv4Address = _ZERO
    yiaddr: IPv4Address = _ZERO
    siaddr: IPv4Address = _ZERO
    giaddr: IPv4Address = _ZERO
    chaddr: bytes = bytes(16)  # the whole field; build pads a shorter value
    sname: bytes = b""  # trailing NULs stripped; empty when it carried options
    file: bytes = b""
    options: dict[int, bytes] = field(default_factory=dict)

    @property
    def message_type(self) -> MessageType | None:
        value = self.options.get(_MESSAGE_TYPE)
        return None if value is None else _MESSAGE_TYPES[value[0]]

    @property
    def broadcast(self) -> bool:
        return bool(self.flags & BROADCAST_FLAG)

    @property
    def mac(self) -> str | None:
        """``"aa:bb:cc:dd:ee:ff"`` for Ethernet (htype 1, hlen 6), else None."""
        if self.htype == 1 and self.hlen == 6:
            return self.chaddr[:6].hex(":")
        return None

    @property
    def client_id(self) -> bytes | None:
        return self.options.get(Opt.CLIENT_ID)

    @property
    def requested_ip(self) -> IPv4Address | None:
        return self._ip(Opt.REQUESTED_IP)

    @property
    def server_id(self) -> IPv4Address | None:
        return self._ip(Opt.SERVER_ID)

    @property
    def subnet_selection(self) -> IPv4Address | None:
        return self._ip(Opt.SUBNET_SELECTION)

    @property
    def max_message_size(self) -> int | None:
        value = self.options.get(Opt.MAX_MESSAGE_SIZE)
        return None if value is None else int.from_bytes(value, "big")

    @property
    def lease_time(self) -> int | None:
        value = self.options.get(Opt.LEASE_TIME)
        return None if value is None else int.from_bytes(value, "big")

    @property
    def parameter_request_list(self) -> list[int]:
        return list(self.options.get(Opt.PARAMETER_REQUEST_LIST, b""))

    @property
    def vendor_class(self) -> bytes | None:
        return self.options.get(Opt.VENDOR_CLASS)

    @property
    def user_classes(self) -> list[bytes]:
        value = self.options.get(Opt.USER_CLASS)
        return [] if value is None else decode_user_classes(value)

    @property
    def client_arches(self) -> list[int]:
        value = self.options.get(Opt.CLIENT_ARCH)
        return [] if value is None else decode_client_arches(value)

    @property
    def hostname(self) -> str | None:
        value = self.options.get(Opt.HOSTNAME)
        return None if value is None else decode_str(value)

    @property
    def relay_agent_info(self) -> bytes | None:
        """Option 82 as received: a server echoes it unchanged (RFC 3046 §2.2)."""
        return self.options.get(Opt.RELAY_AGENT_INFO)

    def _ip(self, code: int) -> IPv4Address | None:
        value = self.options.get(code)
        return None if value is None else IPv4Address(value)


def _read_options(data: bytes, start: int, end: int, options: dict, repeats: list) -> None:
    """Read TLVs from ``data[start:end]``: first instances into ``options``, later ones into
    ``repeats`` as (code, value), to join once at the end (RFC 3396) rather than quadratically."""
    i = start
    while i < end:
        code = data[i]
        if 0 < code < 255:
            k = i + 2
            j = k + data[i + 1] if k <= end else k
            if j > end:
                raise MalformedPacket("truncated-option", f"option {code} at byte {i} overruns")
            if code not in options:
                options[code] = data[k:j]
            elif len(repeats) < MAX_REPEATS:  # there are 254 codes: this bounds the work
                repeats.append((code, data[k:j]))
            else:
                raise MalformedPacket("too-many-options", f"over {MAX_REPEATS} repeated options")
            i = j
        elif code:
            return  # END
        else:  # skip a run of PADs in C: 64 KiB of them take ms one by one
            found = _NOT_PAD.search(data, i, end)
            i = found.start() if found else end


def _overload(options: dict[int, bytes], repeats: list[tuple[int, bytes]]) -> int:
    """Take option 52 out of what the options field held; 0 if absent."""
    value = options.pop(_OVERLOAD, None)
    if value is None:
        return 0
    if any(code == _OVERLOAD for code, _ in repeats):
        value = b"".join([value, *(v for c, v in repeats if c == _OVERLOAD)])
        repeats[:] = [(c, v) for c, v in repeats if c != _OVERLOAD]
    if value not in (b"\x01", b"\x02", b"\x03"):
        raise MalformedPacket("bad-overload", f"option 52 value {value.hex()}")
    return value[0]


def parse_untrusted(data: bytes) -> Message:
    """Decode one BOOTP/DHCP message from the network (rules in the module docstring)."""
    size = len(data)
    if size > MAX_PACKET:
        raise MalformedPacket("too-large", f"{size} bytes > {MAX_PACKET}")
    if size < MIN_MESSAGE:
        raise MalformedPacket("too-short", f"{size} bytes < {MIN_MESSAGE}")
    data = bytes(data)
    (op, htype, hlen, hops, xid, secs, flags, ci, yi, si, gi, chaddr, sname, file, cookie) = (
        _HEADER.unpack_from(data)
    )
    if cookie != MAGIC_COOKIE:
        raise MalformedPacket("bad-cookie", f"{cookie.hex()} (BOOTP without DHCP is not served)")
    if op != BOOTREQUEST and op != BOOTREPLY:
        raise MalformedPacket("bad-op", f"op {op}")
    if hlen > 16:
        raise MalformedPacket("bad-hlen", f"hlen {hlen} > 16")
    options: dict[int, bytes] = {}
    repeats: list[tuple[int, bytes]] = []
    _read_options(data, OPTIONS_AT, size, options, repeats)
    overload = _overload(options, repeats) if _OVERLOAD in options else 0
    if overload:
        if overload & 1:
            _read_options(data, FILE_AT, OPTIONS_AT - 4, options, repeats)
            file = b""
        if overload & 2:
            _read_options(data, SNAME_AT, FILE_AT, options, repeats)
            sname = b""
        if _OVERLOAD in options:  # popped above, so this one came from file or sname
            raise MalformedPacket("bad-overload", "option 52 inside the file or sname field")
    if repeats:
        parts: dict[int, list[bytes]] = {}
        for code, value in repeats:
            parts.setdefault(code, [options[code]]).append(value)
        for code, values in parts.items():
            options[code] = b"".join(values)
    for code, (low, high, step) in _LENGTH_RULES:
        ruled = options.get(code)
        if ruled is not None and not (low <= len(ruled) <= high and len(ruled) % step == 0):
            raise MalformedPacket("bad-option-length", f"option {code}: {len(ruled)} bytes")
    kind = options.get(_MESSAGE_TYPE)
    if kind is not None and not 1 <= kind[0] <= _MAX_TYPE:
        raise MalformedPacket("bad-message-type", f"message type {kind[0]}")
    return Message(
        op, htype, hlen, hops, xid, secs, flags,
        _ZERO if ci == 0 else _address(ci), _ZERO if yi == 0 else _address(yi),
        _ZERO if si == 0 else _address(si), _ZERO if gi == 0 else _address(gi),
        chaddr, sname.rstrip(b"\0"), file.rstrip(b"\0"), options,
    )  # fmt: skip


def _check_options(options: dict[int, bytes]) -> None:
    if not _SETTABLE.issuperset(options):
        raise EncodeError(f"option codes {sorted(set(options) - _SETTABLE)} are not settable")
    if not _BYTES.issuperset(map(type, options.values())):
        raise EncodeError("option values must be bytes")
    for code in _RULED.intersection(options):
        low, high, step = VALUE_LENGTHS[code]
        if not (low <= len(options[code]) <= high and len(options[code]) % step == 0):
            raise EncodeError(f"option {code} cannot be {len(options[code])} bytes long")
    kind = options.get(_MESSAGE_TYPE)
    if kind is not None and not 1 <= kind[0] <= _MAX_TYPE:
        raise EncodeError(f"unknown message type {kind[0]}")


def _wire_order(options: dict[int, bytes], *, relay_info_last: bool) -> list[tuple[int, bytes]]:
    """53, 54, the rest as given, and 82 last (RFC 3046 §2.1 habit) or right after 53/54."""
    head = [c for c in _FIRST if c in options]
    relay = [_LAST] if _LAST in options else []
    rest = [c for c in options if c not in _FIRST and c != _LAST]
    codes = head + rest + relay if relay_info_last else head + relay + rest
    return [(c, options[c]) for c in codes]


def _layout(items: list[tuple[int, bytes]], caps: list[int]) -> list[bytearray] | None:
    """Place the options in fields of the given capacities; None if they do not fit.

    An option of up to 255 bytes goes whole into the first field with room for it:
    clients without RFC 3396 then still read it. Longer ones, and any that fit
    nowhere whole, fill the fields in order, so the pieces concatenate in the
    RFC 3396 order (options, file, sname).
    """
    areas = [bytearray() for _ in caps]
    for code, value in items:
        size = len(value)
        if size <= 255:
            fit = next((k for k, cap in enumerate(caps) if cap - len(areas[k]) >= size + 2), None)
            if fit is not None:
                areas[fit] += _TL(code, size) + value
                continue
            if size == 0:
                return None
        pos = 0
        for area, cap in zip(areas, caps, strict=True):
            room = min(255, cap - len(area) - 2, size - pos)
            while room > 0:
                area += _TL(code, room) + value[pos : pos + room]
                pos += room
                room = min(255, cap - len(area) - 2, size - pos)
        if pos < size:
            return None
    return areas


def _fixed_fields(msg: Message) -> bytes:
    if msg.op not in (BOOTREQUEST, BOOTREPLY) or not 0 <= msg.hlen <= 16:
        raise EncodeError(f"op {msg.op} / hlen {msg.hlen} would be rejected by any parser")
    if len(msg.chaddr) > 16 or len(msg.sname) > 64 or len(msg.file) > 128:
        raise EncodeError("chaddr, sname or file longer than its field (16/64/128 bytes)")
    try:
        return _FIXED.pack(
            msg.op, msg.htype, msg.hlen, msg.hops, msg.xid, msg.secs, msg.flags,
            int(msg.ciaddr), int(msg.yiaddr), int(msg.siaddr), int(msg.giaddr), msg.chaddr,
        )  # fmt: skip
    except (struct.error, TypeError, ValueError) as e:
        raise EncodeError(f"header field out of range: {e}") from e


def _one_instance_each(options: dict[int, bytes]) -> bytes | None:
    """The common case, fast: every option as one TLV, 53 and 54 first, 82 last."""
    try:
        tlvs = {code: _TL(code, len(value)) + value for code, value in options.items()}
    except struct.error:  # a value over 255 bytes
        return None
    first = tlvs.pop(_FIRST[0], b"") + tlvs.pop(_FIRST[1], b"")
    last = tlvs.pop(_LAST, b"")
    return b"".join([first, *tlvs.values(), last])


def _spread(msg: Message, room: int) -> tuple[bytes, bytes, bytes] | None:
    """Options, sname and file fields for options that need several instances or overload."""
    sname, file = msg.sname.ljust(64, b"\0"), msg.file.ljust(128, b"\0")
    areas = _layout(_wire_order(msg.options, relay_info_last=True), [room])
    if areas is not None:
        return bytes(areas[0]), sname, file
    free = [n for n, empty in ((1, not msg.file), (2, not msg.sname)) if empty]
    caps = [room - 3] + [127 if n == 1 else 63 for n in free]  # 3: option 52; 1: END
    areas = _layout(_wire_order(msg.options, relay_info_last=False), caps) if free else None
    if areas is None:
        return None
    overload = 0
    for n, area in zip(free, areas[1:], strict=True):
        if area:
            overload |= n
            padded = bytes(area + b"\xff").ljust(128 if n == 1 else 64, b"\0")
            file, sname = (padded, sname) if n == 1 else (file, padded)
    return bytes(areas[0] + _TL(_OVERLOAD, 1) + bytes((overload,))), sname, file


def build(msg: Message, *, max_size: int = MIN_MAX_SIZE) -> bytes:
    """Encode ``msg``: options 53, 54, the rest in mapping order, 82 last, then END.

    ``max_size`` is the largest IP datagram the peer takes (RFC 2132 §9.10: the
    client's option 57), raised to 576; the message gets ``max_size - 28`` bytes.
    Values over 255 bytes go as several instances (RFC 3396). Output shorter than
    300 bytes is padded to 300. When the options do not fit, they overflow into
    ``file`` and then ``sname`` with option overload 52, using only fields that
    ``msg`` leaves empty; option 82 then moves up to stay in the options field,
    where relays look for it. If they still do not fit: :class:`EncodeError`.
    """
    _check_options(msg.options)
    fixed = _fixed_fields(msg)
    max_size = max(max_size, MIN_MAX_SIZE)
    room = max_size - IP_UDP_HEADERS - OPTIONS_AT - 1  # 1: END
    options = _one_instance_each(msg.options)
    if options is not None and len(options) <= room:
        sname, file = msg.sname.ljust(64, b"\0"), msg.file.ljust(128, b"\0")
    elif (fields := _spread(msg, room)) is not None:
        options, sname, file = fields
    else:
        raise EncodeError(f"options do not fit in a {max_size}-byte datagram")
    out = b"".join((fixed, sname, file, MAGIC_COOKIE, options, b"\xff"))
    return out if len(out) >= MIN_BOOTP else out.ljust(MIN_BOOTP, b"\0")


def option_block(options: dict[int, bytes]) -> bytes | None:
    """``options`` encoded once as :func:`build` lays them out when each fits one instance
    (53, 54, the rest in mapping order, 82 last), checked as :func:`build` checks them;
    None when a value needs several instances. For :func:`build_prepared`."""
    _check_options(options)
    return _one_instance_each(options)


def build_prepared(fixed: tuple, options: bytes, max_size: int = MIN_MAX_SIZE) -> bytes | None:
    """:func:`build`'s bytes for a message with empty ``sname`` and ``file``, its header
    fields ``fixed`` (``op`` to ``chaddr``, addresses as integers) and its options
    already encoded (:func:`option_block`, plus TLVs that keep build's order): none
    of build's per-message work. None when the options do not fit ``max_size`` as
    they are: :func:`build` would spread them, so call it instead. The caller vouches
    for the header (fields of a parsed message are in range)."""
    if len(options) > max(max_size, MIN_MAX_SIZE) - IP_UDP_HEADERS - OPTIONS_AT - 1:
        return None
    out = b"".join((_FIXED.pack(*fixed), _EMPTY_FIELDS, options, b"\xff"))
    return out if len(out) >= MIN_BOOTP else out.ljust(MIN_BOOTP, b"\0")
