"""A TFTP client for plugin tests (the ``tftp`` driver of :mod:`appliance.testing`).

Lock-step reads (RFC 1350, with RFC 2347/2348 options) from a test node's TFTP
server over loopback. Blocking; every wait is bounded, a lost packet is sent again
a few times, as a PXE ROM does.

    data = node.tftp.get("pxelinux.0")
    node.tftp.error("missing")  # (1, "missing: file not found")
"""

from __future__ import annotations

import socket
from typing import Any

from .packets import Data, Error, Opcode, OptionAck, encode_ack, encode_request, parse_untrusted

TIMEOUT = 2.0  # seconds to wait for one packet before sending ours again
TRIES = 5
MAX_SIZE = 64 << 20  # a test file larger than this is a runaway transfer
MAX_PACKET = 65536


class TftpError(AssertionError):
    """The server answered with an ERROR packet, or not at all."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"TFTP error {code}: {message}")
        self.code, self.message = code, message


class TftpClient:
    def __init__(self, node: Any, timeout: float = TIMEOUT) -> None:
        self.server = node.listening("tftp")
        self.timeout = timeout

    def get(self, name: str, blksize: int | None = None) -> bytes:
        """The file's content; :class:`TftpError` if the server refuses it."""
        options = {"blksize": str(blksize)} if blksize else {}
        size = blksize or 512
        data = bytearray()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.settimeout(self.timeout)
            packet, peer = self._ask(sock, encode_request(Opcode.RRQ, name, "octet", options),
                                     self.server, expect=1)  # fmt: skip
            while True:
                if isinstance(packet, OptionAck):
                    size = int(packet.options.get("blksize", 512))
                    ack = 0
                else:
                    assert isinstance(packet, Data)
                    data += packet.payload
                    ack = packet.block
                    if len(packet.payload) < size:
                        sock.sendto(encode_ack(ack), peer)
                        return bytes(data)
                if len(data) > MAX_SIZE:
                    raise TftpError(0, f"{name}: more than {MAX_SIZE} bytes")
                packet, _ = self._ask(sock, encode_ack(ack), peer, expect=(ack + 1) & 0xFFFF)

    def error(self, name: str) -> tuple[int, str]:
        """The ERROR a read of ``name`` gets: ``(code, message)``."""
        try:
            self.get(name)
        except TftpError as exc:
            return exc.code, exc.message
        raise AssertionError(f"{name!r} was served")

    def _ask(self, sock: socket.socket, query: bytes, peer: tuple[str, int],
             expect: int) -> tuple[Data | OptionAck, tuple[str, int]]:  # fmt: skip
        """Send ``query`` (again on each timeout) until DATA block ``expect`` or an OACK."""
        for _ in range(TRIES):
            sock.sendto(query, peer)
            try:
                for _ in range(64):  # skip duplicates of the previous block
                    raw, sender = sock.recvfrom(MAX_PACKET)
                    packet = parse_untrusted(raw)
                    if isinstance(packet, Error):
                        raise TftpError(packet.code, packet.message)
                    if isinstance(packet, OptionAck) or (
                        isinstance(packet, Data) and packet.block == expect
                    ):
                        return packet, sender
            except TimeoutError:
                continue
        raise TftpError(0, f"no answer from {peer[0]}:{peer[1]} after {TRIES} tries")
