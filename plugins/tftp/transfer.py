"""The sans-IO read transfer for one client (RFC 1350, 2347, 7440).

Shaped like aioquic's QuicConnection: the shell feeds ``receive_datagram`` and
``handle_timer`` with an explicit ``now``, sends ``datagrams_to_send(now)``, arms
``get_timer()`` and drains ``next_event()``. The shell only feeds datagrams from
the client's transfer ID (its socket is connected to the client). Malformed
datagrams are counted and dropped.

Blocks are numbered absolutely (1, 2, ... without bound) and sent modulo 2**16,
so block 65536 goes out as 0 (tftpd-hpa and atftpd wrap the same way). A 16-bit
ACK is read as the one block in ``[acked, sent]`` it can name: the window is at
most 65535 blocks, so at most one matches. An ACK of a block already acknowledged,
or of one not sent, changes nothing and sends nothing (no Sorcerer's Apprentice);
an ACK inside the window slides it and resends from the block after (RFC 7440).
A timeout resends the window from the first unacknowledged block, doubling the
wait up to ``max_timeout``; ``retries`` timeouts in a row without progress end the
transfer with no ERROR sent. Until the client has acknowledged anything (the
OACK or block 1: ``verified``), the source address may be forged and nobody may
be listening, so such a transfer ends after ``unverified_retries`` timeouts
(default 2: three sends over 7 s at the default timeouts, against 31 s for a
transfer that made progress); a flood of requests never answered frees its
slots that much sooner (docs/tftp.md, "Admission").

netascii (``netascii=True``) turns LF into CR LF and CR into CR NUL as blocks are
cut; the size sent is then not known up front, so the shell offers no ``tsize``
(``negotiate(file_size=None)``). ``size`` is always the source file's size.

File bytes come from ``reader(offset, size)``, which returns exactly ``size``
bytes (or any bytes-like object, e.g. a memoryview of a read-ahead buffer)
unless the file ends first. It is called only from ``datagrams_to_send`` and
``ack_next``, so a shell can run those calls off its event loop; the DATA
datagrams of the current window are cached (at most windowsize x blksize bytes)
for retransmission.

The lock-step fast path: while the machine waits for the ACK of the one block
it has sent (windowsize 1), ``fast_ack`` holds that exact 4-byte ACK and
``fast_data`` the next block's DATA, already read and encoded. A shell that
receives a datagram equal to ``fast_ack`` may send ``fast_data`` at once and
then call ``ack_next(now)``, instead of ``receive_datagram`` +
``datagrams_to_send``: the same transition (the block is acknowledged, the next
one sent, the timer re-armed), with only a compare between the ACK arriving and
the DATA leaving, and none of the parsing, window and list bookkeeping that was
most of the Python time per block (bench/README.md, bench.tftp). The machine
therefore reads one block ahead in lock-step: a reader must have ``2 x blksize``
bytes ready. ``fast_ack`` is None whenever the shortcut would not be the same
transition (a window, the OACK, the final block in flight, a timeout pending,
the end) or the block ahead could not be read (the general path meets the error
when that block is due).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .negotiate import Options
from .packets import (
    MAX_PACKET,
    Ack,
    ErrorCode,
    MalformedPacket,
    Opcode,
    encode_ack,
    encode_data,
    encode_error,
    encode_oack,
    parse_untrusted,
)
from .packets import Error as ErrorPacket

Reader = Callable[[int, int], bytes | memoryview]
_ACK_OPCODE = Opcode.ACK.to_bytes(2, "big")


@dataclass(frozen=True, slots=True)
class TransferComplete:
    bytes_sent: int  # payload bytes of the file as sent (after netascii conversion)
    retransmits: int  # OACK/DATA packets sent again


@dataclass(frozen=True, slots=True)
class TransferFailed:
    code: int
    reason: str
    remote: bool = False  # the client sent the ERROR; nothing was answered


Event = TransferComplete | TransferFailed


class _State(enum.Enum):
    OACK = 1  # OACK sent, waiting for ACK 0
    DATA = 2
    DONE = 3


# As globals: an Enum member lookup costs ~190 ns on 3.11, and these are read per block.
_OACK, _DATA, _DONE = _State.OACK, _State.DATA, _State.DONE


class ReadTransfer:
    """Serve one file to one client. Not thread-safe; owned by one task."""

    def __init__(
        self,
        reader: Reader,
        size: int | None,
        options: Options,
        now: float,
        *,
        netascii: bool = False,
        retries: int = 5,
        unverified_retries: int = 2,
        initial_timeout: float = 1.0,
        max_timeout: float = 8.0,
    ) -> None:
        self._read = reader
        self._size = size  # bytes in the source file; None: read until a short read
        self._blksize = options.blksize
        self._window = options.windowsize
        self._netascii = netascii
        self._oack = dict(options.oack)
        # The client's timeout option is its own retransmission interval: use it as our base.
        self._base = float(options.timeout) if options.timeout else initial_timeout
        self._cap = max(self._base, max_timeout)
        self._timeout = self._base
        self._retries = retries
        self._unverified_retries = min(retries, unverified_retries)
        self._oack_acked = False  # the client acknowledged our OACK (ACK 0)
        self._attempts = 0  # timeouts since the last progress
        self._state = _OACK if self._oack else _DATA
        self._acked = 0  # every block <= acked is acknowledged (0: the OACK, or nothing yet)
        self._sent = 0  # highest block sent so far
        self._last: int | None = None  # the final (short) block, once read
        self._cache: dict[int, bytes] = {}  # DATA not yet acknowledged (+ lock-step read-ahead)
        self._src_offset = 0
        self._src_eof = False
        self._pending = bytearray()  # netascii output not yet cut into blocks
        self._send_from: int | None = 0 if self._oack else 1  # 0 stands for the OACK
        self._out: list[bytes] = []
        self._timer: float | None = now + self._timeout  # the shell sends at once
        self._events: deque[Event] = deque()
        self.fast_ack: bytes | None = None  # the lock-step fast path: see the module docstring
        self.fast_data: bytes | None = None
        self.bytes_sent = 0
        self.retransmits = 0
        self.malformed = 0

    @property
    def verified(self) -> bool:
        """The client acknowledged something: it is at its address and listening."""
        return self._acked > 0 or self._oack_acked

    @property
    def done(self) -> bool:
        """Finished either way; flush ``datagrams_to_send`` once more for a final ERROR."""
        return self._state is _DONE

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        return None if self._state is _DONE else self._timer

    def receive_datagram(self, data: bytes, now: float) -> None:
        if self._state is _DONE:
            return
        if data[:2] == _ACK_OPCODE and 4 <= len(data) <= MAX_PACKET:
            # The hot path (every block): exactly what parse_untrusted makes of an ACK.
            self._on_ack(int.from_bytes(data[2:4], "big"))
            return
        try:
            packet = parse_untrusted(data)
        except MalformedPacket:
            self.malformed += 1
            return
        if isinstance(packet, Ack):
            self._on_ack(packet.block)
        elif isinstance(packet, ErrorPacket):
            # Includes ERROR 8 in answer to our OACK: stop quietly, never answer an ERROR.
            self._finish(TransferFailed(packet.code, packet.message, remote=True))
        else:
            self._fail(ErrorCode.ILLEGAL_OPERATION, "illegal TFTP operation")

    def handle_timer(self, now: float) -> None:
        if self._state is _DONE or self._timer is None or now < self._timer:
            return
        self._timer = None
        self.fast_ack = self.fast_data = None
        self._attempts += 1
        if self._attempts > (self._retries if self.verified else self._unverified_retries):
            # No ERROR: a client that hears nothing from us would not hear it either.
            self._finish(TransferFailed(ErrorCode.NOT_DEFINED, "timed out"))
            return
        self._timeout = min(self._timeout * 2, self._cap)
        self._send_from = 0 if self._state is _OACK else self._acked + 1

    def datagrams_to_send(self, now: float) -> list[bytes]:
        start, self._send_from = self._send_from, None
        if start is not None and self._state is not _DONE:
            try:
                self._out += self._window_from(start)
            except _ReadError as exc:
                self._fail(ErrorCode.NOT_DEFINED, str(exc))
            if self._state is not _DONE:
                self._timer = now + self._timeout
                self._arm_fast_path()
        out, self._out = self._out, []
        return out

    def evict(self) -> None:
        """The server takes this transfer's slot for another client (docs/tftp.md,
        "Admission"). A verified client is told (ERROR 0, ``datagrams_to_send``); an
        unverified source gets nothing, as it may be forged."""
        if self._state is _DONE:
            return
        if self.verified:
            self._fail(ErrorCode.NOT_DEFINED, "server busy, try again later")
        else:
            self._finish(TransferFailed(ErrorCode.NOT_DEFINED, "evicted"))

    def ack_next(self, now: float) -> None:
        """``fast_ack`` arrived and the shell sent ``fast_data``: finish the transition.

        Exactly what ``receive_datagram(fast_ack, now)`` then ``datagrams_to_send(now)``
        would have done, the datagram sent included; only valid while ``fast_ack`` is set.
        """
        acked, sent = self._sent, self._sent + 1
        del self._cache[acked]
        self._acked, self._sent = acked, sent
        self.bytes_sent += len(self._cache[sent]) - 4
        self._attempts = 0
        self._timeout = self._base
        self._timer = now + self._timeout
        self._arm_fast_path()

    # -- internals

    def _window_from(self, start: int) -> list[bytes]:
        if start == 0:
            if self._attempts:
                self.retransmits += 1
            return [encode_oack(self._oack)]
        out = []
        for block in range(start, self._acked + self._window + 1):
            datagram = self._datagram(block)
            out.append(datagram)
            if block <= self._sent:
                self.retransmits += 1
            else:
                self.bytes_sent += len(datagram) - 4
                self._sent = block
            if block == self._last:
                break
        return out

    def _arm_fast_path(self) -> None:
        self.fast_ack = self.fast_data = None
        sent = self._sent
        if self._window == 1 and self._state is _DATA and sent == self._acked + 1:
            if sent == self._last:
                return  # its ACK ends the transfer
            try:
                self.fast_data = self._datagram(sent + 1)
            except _ReadError:
                return  # the general path meets the error again when that block is due
            self.fast_ack = encode_ack(sent & 0xFFFF)

    def _on_ack(self, wire: int) -> None:
        if self._state is _OACK:
            if wire == 0:
                self._oack_acked = True
                self._state = _DATA
                self._progress()
                self._send_from = 1
            return
        block = self._acked + ((wire - self._acked) & 0xFFFF)
        if block == self._acked or block > self._sent:
            return  # duplicate or stray: acting on it would be the Sorcerer's Apprentice bug
        self.fast_ack = self.fast_data = None  # datagrams_to_send sets them again
        for old in range(self._acked + 1, block + 1):
            self._cache.pop(old, None)
        self._acked = block
        self._progress()
        if block == self._last:
            self._finish(TransferComplete(self.bytes_sent, self.retransmits))
        else:
            # RFC 7440: an ACK inside the window means the rest was lost; restart after it.
            self._send_from = block + 1

    def _progress(self) -> None:
        self._attempts = 0
        self._timeout = self._base

    def _datagram(self, block: int) -> bytes:
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        # Windows restart at acked + 1 and blocks <= acked leave the cache, so a block
        # not cached is always the next one to read.
        payload = self._next_payload()
        # The one copy of the payload (from the reader's buffer into the datagram).
        datagram = self._cache[block] = encode_data(block & 0xFFFF, payload)
        if len(payload) < self._blksize:
            self._last = block
        return datagram

    def _next_payload(self) -> bytes | memoryview:
        if self._netascii:
            while len(self._pending) < self._blksize and not self._src_eof:
                chunk = self._read_source()
                # Byte by byte independent, so chunk boundaries need no care.
                self._pending += bytes(chunk).replace(b"\r", b"\r\0").replace(b"\n", b"\r\n")
            payload = bytes(self._pending[: self._blksize])
            del self._pending[: self._blksize]
            return payload
        return self._read_source()

    def _read_source(self) -> bytes | memoryview:
        want = self._blksize
        if self._size is not None:
            want = min(want, self._size - self._src_offset)
        try:
            data = self._read(self._src_offset, want) if want > 0 else b""
        except OSError as exc:
            raise _ReadError(f"read error ({exc.strerror or type(exc).__name__})") from None
        if len(data) > want or (self._size is not None and len(data) < want):
            # The size announced (tsize) no longer holds: fail rather than send a wrong file.
            raise _ReadError("file changed during transfer")
        self._src_offset += len(data)
        self._src_eof = len(data) < self._blksize
        return data

    def _fail(self, code: ErrorCode, reason: str) -> None:
        self._out = [encode_error(code, reason)]
        self._finish(TransferFailed(code, reason))

    def _finish(self, event: Event) -> None:
        self._state = _DONE
        self._timer = None
        self.fast_ack = self.fast_data = None
        self._cache.clear()
        self._events.append(event)


class _ReadError(Exception):
    pass
