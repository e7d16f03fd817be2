"""Client-side messages for driving the sans-IO server in tests, built with our codec."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

from plugins.dhcp.codec import BROADCAST_FLAG, Message, build, parse_untrusted
from plugins.dhcp.model import ServerConfig, Subnet
from plugins.dhcp.options import MessageType, Opt, encode_ip
from plugins.dhcp.server import Arrival, Outcome

SERVER = IPv4Address("192.0.2.1")
NET = IPv4Network("192.0.2.0/24")
RELAY_NET = IPv4Network("198.51.100.0/24")
ON_LINK = Arrival("eth1", int(SERVER), ("0.0.0.0", 68))


def ip(text: str) -> int:
    return int(IPv4Address(text))


def subnet(network=NET, pool=("192.0.2.100", "192.0.2.109"), **kw) -> Subnet:
    return Subnet(network, pools=((ip(pool[0]), ip(pool[1])),), **kw)


def config(*subnets: Subnet, **kw) -> ServerConfig:
    kw.setdefault("subnets", subnets or (subnet(router=SERVER, dns=(SERVER,)),))
    return ServerConfig(**kw)


def mac(n: int) -> bytes:
    return bytes([0x52, 0x54, 0, 0, n >> 8, n & 0xFF])


def message(
    kind: MessageType,
    hw: bytes,
    *,
    xid: int = 1,
    requested: str | None = None,
    server_id: str | IPv4Address | None = None,
    ciaddr: str = "0.0.0.0",
    giaddr: str = "0.0.0.0",
    broadcast: bool = False,
    options: dict[int, bytes] | None = None,
) -> bytes:
    opts: dict[int, bytes] = {Opt.MESSAGE_TYPE: bytes([kind])}
    if requested:
        opts[Opt.REQUESTED_IP] = encode_ip(requested)
    if server_id:
        opts[Opt.SERVER_ID] = encode_ip(server_id)
    opts.update(options or {})
    msg = Message(
        xid=xid,
        flags=BROADCAST_FLAG if broadcast else 0,
        ciaddr=IPv4Address(ciaddr),
        giaddr=IPv4Address(giaddr),
        hops=1 if giaddr != "0.0.0.0" else 0,
        chaddr=hw.ljust(16, b"\0"),
        options=opts,
    )
    return build(msg)


def reply_of(outcome: Outcome) -> Message:
    assert len(outcome.replies) == 1, outcome
    return parse_untrusted(outcome.replies[0].payload)
