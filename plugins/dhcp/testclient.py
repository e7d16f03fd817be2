"""A DHCP client for plugin tests (the ``dhcp`` driver of :mod:`appliance.testing`).

It speaks to a test node's DHCP server over loopback, from ``127.0.0.1``; the
development node answers a loopback client at its own address and port. Blocking,
each wait bounded.

    ack = node.dhcp.dora("52:54:00:00:00:01", params=[125], vendor_class=b"PXEClient")
    ack.yiaddr, ack.options[125]
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable
from ipaddress import IPv4Address
from typing import Any

from .codec import Message, build, parse_untrusted
from .options import (
    MessageType,
    Opt,
    encode_client_arches,
    encode_ip,
    encode_param_request_list,
    encode_str,
)

TIMEOUT = 5.0  # seconds to wait for one reply
MAX_REPLY = 65535


class NoReply(AssertionError):
    """The server did not answer in time (or answered something else than expected)."""


class DhcpClient:
    def __init__(self, node: Any, timeout: float = TIMEOUT) -> None:
        self.server = ("127.0.0.1", node.config["dhcp"].port)
        self.timeout = timeout
        self._xid = random.Random().getrandbits(32)

    def exchange(self, kind: MessageType, mac: str, *, requested: str | IPv4Address | None = None,
                 server_id: IPv4Address | None = None, ciaddr: str = "0.0.0.0",
                 params: Iterable[int] = (), vendor_class: bytes | None = None,
                 arch: int | None = None, hostname: str | None = None,
                 options: dict[int, bytes] | None = None) -> Message | None:  # fmt: skip
        """Send one message and return the reply (``None`` for RELEASE and DECLINE, which
        get none)."""
        opts: dict[int, bytes] = {Opt.MESSAGE_TYPE: bytes([kind])}
        if requested is not None:
            opts[Opt.REQUESTED_IP] = encode_ip(requested)
        if server_id is not None:
            opts[Opt.SERVER_ID] = encode_ip(server_id)
        if params:
            opts[Opt.PARAMETER_REQUEST_LIST] = encode_param_request_list(params)
        if vendor_class is not None:
            opts[Opt.VENDOR_CLASS] = vendor_class
        if arch is not None:
            opts[Opt.CLIENT_ARCH] = encode_client_arches([arch])
        if hostname is not None:
            opts[Opt.HOSTNAME] = encode_str(hostname)
        opts.update(options or {})
        self._xid = (self._xid + 1) & 0xFFFFFFFF
        chaddr = bytes.fromhex(mac.replace(":", "")).ljust(16, b"\0")
        query = build(
            Message(xid=self._xid, ciaddr=IPv4Address(ciaddr), chaddr=chaddr, options=opts)
        )
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.settimeout(self.timeout)
            sock.sendto(query, self.server)
            if kind in (MessageType.RELEASE, MessageType.DECLINE):
                return None
            return self._reply(sock)

    def _reply(self, sock: socket.socket) -> Message:
        """The reply to our transaction (others' datagrams skipped), bounded in count."""
        for _ in range(64):
            try:
                data, _ = sock.recvfrom(MAX_REPLY)
            except TimeoutError:
                break
            reply = parse_untrusted(data)
            if reply.xid == self._xid:
                return reply
        raise NoReply(
            f"no DHCP reply from {self.server[0]}:{self.server[1]} within {self.timeout} s"
        )

    def discover(self, mac: str, **kw: Any) -> Message:
        offer = self.exchange(MessageType.DISCOVER, mac, **kw)
        assert offer is not None
        if offer.message_type is not MessageType.OFFER:
            raise NoReply(f"DISCOVER answered with {offer.message_type}, not an OFFER")
        return offer

    def dora(self, mac: str, **kw: Any) -> Message:
        """DISCOVER, OFFER, REQUEST, ACK: the ACK (the same options on both requests)."""
        offer = self.discover(mac, **kw)
        ack = self.exchange(MessageType.REQUEST, mac, requested=offer.yiaddr,
                            server_id=offer.server_id, **kw)  # fmt: skip
        assert ack is not None
        if ack.message_type is not MessageType.ACK:
            raise NoReply(f"REQUEST answered with {ack.message_type}, not an ACK")
        return ack

    def release(self, mac: str, address: str | IPv4Address, server_id: IPv4Address) -> None:
        self.exchange(MessageType.RELEASE, mac, ciaddr=str(address), server_id=server_id)
