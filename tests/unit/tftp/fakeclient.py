"""A reading TFTP client for driving the transfer machine with explicit time."""

from __future__ import annotations

from plugins.tftp.packets import Data, Error, OptionAck, encode_ack, parse_untrusted


def pattern(offset: int, size: int) -> bytes:
    """A reader whose file byte at ``i`` is ``i * 7 % 251``: any length, nothing stored."""
    return bytes((i * 7) % 251 for i in range(offset, offset + size))


def reader_for(data: bytes):
    return lambda offset, size: data[offset : offset + size]


class FakeClient:
    """RFC 1350/7440 reader: keeps blocks in order, ACKs each full window or the final
    block, and re-ACKs its last in-order block on a gap (RFC 7440) and on its own
    timeout. Like FreeBSD's tftp it ignores duplicates of the blocks just received,
    except the first of a resent window; ``reack_duplicates`` makes it re-ACK every
    duplicate instead, as lock-step clients do. Keeps answering after completion, as
    a dallying client does."""

    def __init__(
        self,
        blksize: int = 512,
        windowsize: int = 1,
        timeout: float = 1.5,
        reack_duplicates: bool = False,
    ) -> None:
        self.blksize, self.windowsize, self.timeout = blksize, windowsize, timeout
        self.reack_duplicates = reack_duplicates
        self.data = bytearray()
        self.next = 1  # absolute number of the block expected next
        self.since_ack = 0
        self.complete = False
        self.error: Error | None = None
        self.oack: dict[str, str] | None = None
        self.timer: float | None = timeout
        self.outbox: list[bytes] = []
        self.received = 0

    def _ack(self, now: float) -> None:
        self.outbox.append(encode_ack((self.next - 1) & 0xFFFF))
        self.since_ack = 0
        self.timer = None if self.complete else now + self.timeout

    def receive(self, datagram: bytes, now: float) -> None:
        self.received += 1
        packet = parse_untrusted(datagram)
        if isinstance(packet, Error):
            self.error, self.timer = packet, None
        elif isinstance(packet, OptionAck):
            if self.next == 1:
                self.oack = packet.options
                self._ack(now)
        elif isinstance(packet, Data):
            if not self.complete and packet.block == self.next & 0xFFFF:
                self.data += packet.payload
                self.next += 1
                self.since_ack += 1
                self.complete = len(packet.payload) < self.blksize
                if self.complete or self.since_ack >= self.windowsize:
                    self._ack(now)
            elif self.complete or self.reack_duplicates or self._outside_window(packet.block):
                self._ack(now)

    def _outside_window(self, block: int) -> bool:
        return (self.next - 1 - block) & 0xFFFF >= self.windowsize - 1

    def handle_timer(self, now: float) -> None:
        if self.timer is not None and now >= self.timer:
            self._ack(now)

    def take(self) -> list[bytes]:
        out, self.outbox = self.outbox, []
        return out
