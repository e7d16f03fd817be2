"""The hot path's shortcuts answer what the general path answers.

Replies from pre-encoded option blocks are byte for byte what the general builder makes.

The server answers the common case (no boot answer, no hostname, no hook that adds
options) with :func:`~plugins.dhcp.codec.build_prepared` over an
:func:`~plugins.dhcp.codec.option_block` encoded once per subnet, kind and server
identifier. These tests keep that fast path honest: the codec's pair against
:func:`~plugins.dhcp.codec.build` on random messages, and the whole server with and
without it on random subnets, clients and relays.
"""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network

from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.dhcp.codec import BOOTREPLY, Message, build, build_prepared, option_block
from plugins.dhcp.model import Reservation
from plugins.dhcp.options import MessageType, Opt
from plugins.dhcp.server import Arrival, DhcpServer, Policy
from tests.unit.dhcp.clients import ON_LINK, SERVER, config, ip, mac, message, subnet

from .strategies import addresses, option_maps, u8, u16, u32

D, R, INFORM = MessageType.DISCOVER, MessageType.REQUEST, MessageType.INFORM
T0 = 1_800_000_000.0
RELAY = "198.51.100.1"
RELAY_NET = IPv4Network("198.51.100.0/24")


def fixed_of(msg: Message) -> tuple:
    return (
        msg.op, msg.htype, msg.hlen, msg.hops, msg.xid, msg.secs, msg.flags, int(msg.ciaddr),
        int(msg.yiaddr), int(msg.siaddr), int(msg.giaddr), msg.chaddr,
    )  # fmt: skip


@settings(deadline=None, max_examples=300)
@given(
    st.builds(
        Message,
        op=st.just(BOOTREPLY),
        htype=u8,
        hlen=st.integers(0, 16),
        hops=u8,
        xid=u32,
        secs=u16,
        flags=u16,
        ciaddr=addresses,
        yiaddr=addresses,
        siaddr=addresses,
        giaddr=addresses,
        chaddr=st.binary(min_size=16, max_size=16),
        options=option_maps(max_options=16, max_size=300),
    ),
    st.sampled_from([0, 300, 576, 600, 1500, 65535]),
)
def test_build_prepared_is_build_or_declines(msg: Message, max_size: int):
    """Whenever build_prepared answers, it is build's answer; it declines only what build
    would spread over several instances or into the file and sname fields."""
    block = option_block(msg.options)
    if block is None:  # a value over 255 bytes: several instances
        assert any(len(v) > 255 for v in msg.options.values())
        return
    prepared = build_prepared(fixed_of(msg), block, max_size)
    if prepared is not None:
        assert prepared == build(msg, max_size=max_size)
    else:
        assert len(block) > max(max_size, 576) - 28 - 240 - 1


def test_option_block_checks_what_build_checks():
    import pytest

    from plugins.dhcp.codec import EncodeError

    with pytest.raises(EncodeError):
        option_block({Opt.OVERLOAD: b"\x01"})
    with pytest.raises(EncodeError):
        option_block({Opt.SERVER_ID: b"\x01\x02"})


# -- the server with and without its prepared replies -------------------------------------------


def pair(cfg) -> tuple[DhcpServer, DhcpServer]:
    fast, general = DhcpServer(cfg), DhcpServer(cfg)
    general.prepared_replies = False
    return fast, general


def same(fast: DhcpServer, general: DhcpServer, data: bytes, arrival: Arrival, now: float):
    a, b = fast.handle(data, arrival, now), general.handle(data, arrival, now)
    assert [r.payload for r in a.replies] == [r.payload for r in b.replies]
    assert a.replies == b.replies and a.commits == b.commits and a.dropped == b.dropped
    return a


SUBNET_OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "router": st.just(SERVER),
        "dns": st.lists(
            st.sampled_from([SERVER, IPv4Address("192.0.2.53")]), min_size=1, max_size=40
        ).map(tuple),  # fmt: skip
        "domain": st.text(min_size=1, max_size=300),
        "mtu": st.integers(576, 9000),
        "ntp": st.just((IPv4Address("192.0.2.123"),)),
        "routes": st.lists(
            st.just((IPv4Network("10.0.0.0/8"), SERVER)), min_size=1, max_size=30
        ).map(tuple),
        "lease_time": st.integers(60, 2**31),
    },
)


@settings(deadline=None, max_examples=150)
@given(
    SUBNET_OPTIONS,
    st.sampled_from(["none", "server_address", "vip"]),
    st.lists(
        st.tuples(
            st.integers(0, 5),  # client
            st.booleans(),  # relayed
            st.sampled_from(
                [None, b"\x01\x04abcd", b"\x05\x04" + bytes([192, 0, 2, 0]), bytes(300)]
            ),  # option 82  # fmt: skip
            st.sampled_from([None, 576, 1500, 400]),  # option 57
            st.booleans(),  # broadcast flag
            st.sampled_from(["dora", "inform", "renew"]),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_the_server_answers_the_same_with_and_without_prepared_replies(options, identity, steps):
    extra = {}
    if identity == "server_address":
        extra["server_address"] = IPv4Address("192.0.2.9")
    elif identity == "vip":
        extra["vip"] = IPv4Address("192.0.2.5")
    link = subnet(**options)
    relayed = replace(
        link, network=RELAY_NET, pools=((ip("198.51.100.100"), ip("198.51.100.150")),)
    )
    fast, general = pair(config(link, relayed, **extra))
    now, offered = T0, False
    for client, via_relay, info, max_size, broadcast, what in steps:
        now += 1
        kw: dict = {"broadcast": broadcast, "xid": client + 7}
        opts: dict[int, bytes] = {}
        if info is not None:
            opts[Opt.RELAY_AGENT_INFO] = info
        if max_size is not None:
            opts[Opt.MAX_MESSAGE_SIZE] = max_size.to_bytes(2, "big")
        if via_relay:
            kw["giaddr"] = RELAY
        kw["options"] = opts
        hw = mac(client)
        if what == "inform":
            same(fast, general, message(INFORM, hw, ciaddr="192.0.2.77", **kw), ON_LINK, now)
            continue
        offer = same(fast, general, message(D, hw, **kw), ON_LINK, now)
        if not offer.replies:
            continue
        offered = True
        sent = offer.replies[0].payload
        yiaddr, server_id = str(IPv4Address(sent[16:20])), fast._server_id(ON_LINK)
        same(fast, general,
             message(R, hw, requested=yiaddr, server_id=IPv4Address(server_id), **kw),
             ON_LINK, now)  # fmt: skip
        if what == "renew":
            same(fast, general, message(R, hw, ciaddr=yiaddr, **kw), ON_LINK, now + 10)
    assert not general._blocks and (fast._blocks or not offered)  # the prepared path answered


def test_the_general_path_answers_what_the_prepared_one_cannot():
    """A reservation's hostname, a boot answer and a hook's options take build(); the
    prepared replies for the same clients otherwise are the same bytes as the builder's."""
    reservation = Reservation(ip("192.0.2.100"), mac=mac(1), hostname="web1")
    fast, general = pair(config(reservations=(reservation,)))
    same(fast, general, message(D, mac(1)), ON_LINK, T0)  # hostname: built
    pxe = {Opt.VENDOR_CLASS: b"PXEClient:Arch:00000:UNDI:002001"}
    same(fast, general, message(D, mac(2), options=pxe), ON_LINK, T0)  # boot: built

    class Hook(Policy):
        def reply_options(self, request, reply, lease):
            reply.options[250] = b"hi"

    hooked = DhcpServer(config(), policy=Hook())
    assert hooked.policy.alters_replies()
    (reply,) = hooked.handle(message(D, mac(3)), ON_LINK, T0).replies
    assert b"\xfa\x02hi" in reply.payload
    assert not Policy().alters_replies()


def test_the_host_policy_is_asked_only_when_it_may_answer():
    asked: list[str] = []

    class Hosts(Policy):
        def host(self, mac, client_id):
            asked.append(mac)
            return Reservation(ip("192.0.2.105"), hostname="") if mac.endswith("07") else None

    assert not Policy().looks_up_hosts() and Hosts().looks_up_hosts()
    server = DhcpServer(config(), policy=Hosts())
    (offer,) = server.handle(message(D, mac(7)), ON_LINK, T0).replies
    assert offer.payload[16:20] == bytes([192, 0, 2, 105]) and asked == ["52:54:00:00:00:07"]


def test_the_subnets_of_relays_are_remembered_within_a_bound():
    from plugins.dhcp.server import RELAY_CACHE

    relayed = subnet(RELAY_NET, pool=("198.51.100.100", "198.51.100.150"))
    server = DhcpServer(config(subnet(), relayed))
    for n in range(RELAY_CACHE + 10):
        giaddr = str(IPv4Address(int(IPv4Address("10.0.0.0")) + n))  # no subnet of ours
        assert server.handle(message(D, mac(1), giaddr=giaddr), ON_LINK, T0).dropped == "no-subnet"
        assert len(server._relay_subnets) <= RELAY_CACHE
    out = server.handle(message(D, mac(1), giaddr=RELAY), ON_LINK, T0)
    assert out.replies[0].address == RELAY and out.replies[0].payload[16:20] == bytes(
        [198, 51, 100, 100]
    )
    # Option 82's link selection still wins over the cached giaddr.
    link = {Opt.RELAY_AGENT_INFO: b"\x05\x04" + bytes([192, 0, 2, 7])}
    out = server.handle(message(D, mac(2), giaddr=RELAY, options=link), ON_LINK, T0)
    assert out.replies[0].payload[16:20] == bytes([192, 0, 2, 100])
