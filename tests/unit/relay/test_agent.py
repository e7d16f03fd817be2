"""The relay agent (plugins/relay/agent.py), sans-IO: what it forwards, delivers and drops.

Messages are built and read back with the DHCP server's own codec (an independent
parser of the same wire format); a fuzz test feeds arbitrary bytes to both sides."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.dhcp.codec import Message, build, parse_untrusted
from plugins.relay.agent import (
    BROADCAST,
    REASONS,
    Link,
    RelayAgent,
    RelayConfig,
    circuit_id,
    scan_untrusted,
)

SERVER = int(IPv4Address("10.0.0.2"))
SOURCE = int(IPv4Address("10.0.0.9"))
V101 = Link("vlan101", int(IPv4Address("10.1.1.1")), b"vlan101", b"rack7")
V102 = Link("vlan102", int(IPv4Address("10.1.2.1")), b"v102", link_selection=True,
            server_id_override=True)  # fmt: skip
MAC = bytes.fromhex("525400123456")


def agent(**kw) -> RelayAgent:
    config = dict(links=(V101, V102), servers=(SERVER,), source=SOURCE)
    return RelayAgent(RelayConfig(**{**config, **kw}))


def discover(**fields) -> bytes:
    return build(Message(xid=7, chaddr=MAC, options={53: b"\x01", 55: b"\x01\x03"}, **fields))


def offer(giaddr: str, *, flags: int = 0, kind: int = 2, option82: bytes | None = None,
          ciaddr: str = "0.0.0.0") -> bytes:  # fmt: skip
    options = {53: bytes((kind,)), 54: IPv4Address("10.0.0.2").packed}
    if option82 is not None:
        options[82] = option82
    return build(Message(op=2, xid=7, flags=flags, chaddr=MAC, yiaddr=IPv4Address("10.1.1.50"),
                         ciaddr=IPv4Address(ciaddr), giaddr=IPv4Address(giaddr),
                         options=options))  # fmt: skip


def test_a_request_gets_giaddr_a_hop_and_option_82_and_goes_to_every_server():
    relay = agent(servers=(SERVER, SERVER + 1))
    out = relay.from_client(discover(), "vlan101")
    assert out.servers == (SERVER, SERVER + 1)
    sent = parse_untrusted(out.payload)
    assert sent.giaddr == IPv4Address("10.1.1.1") and sent.hops == 1 and sent.xid == 7
    assert sent.options[55] == b"\x01\x03" and sent.chaddr[:6] == MAC
    assert sent.options[82] == b"\x01\x07vlan101\x02\x05rack7"
    assert relay.requests["vlan101"] == 1


def test_link_selection_uses_the_source_as_giaddr_and_names_the_link():
    out = agent().from_client(discover(), "vlan102")
    sent = parse_untrusted(out.payload)
    assert sent.giaddr == IPv4Address("10.0.0.9")
    link = IPv4Address("10.1.2.1").packed
    assert sent.options[82] == b"\x01\x04v102" + b"\x05\x04" + link + b"\x0b\x04" + link


def test_a_reply_is_stripped_of_option_82_and_delivered_by_the_rules_of_rfc_2131():
    relay = agent()
    echoed = b"\x01\x07vlan101\x02\x05rack7"
    d = relay.from_server(offer("10.1.1.1", option82=echoed), SERVER)
    assert d.interface == "vlan101" and d.address == int(IPv4Address("10.1.1.50"))
    assert d.hwaddr == MAC  # unicast to yiaddr at chaddr: an ARP entry first
    got = parse_untrusted(d.payload)
    assert 82 not in got.options and got.yiaddr == IPv4Address("10.1.1.50")
    # the broadcast flag, a NAK: broadcast; ciaddr set: to ciaddr
    flagged = relay.from_server(offer("10.1.1.1", flags=0x8000), SERVER)
    assert flagged.address == BROADCAST and flagged.hwaddr is None
    assert relay.from_server(offer("10.1.1.1", kind=6), SERVER).address == BROADCAST
    renewing = relay.from_server(offer("10.1.1.1", ciaddr="10.1.1.77"), SERVER)
    assert renewing.address == int(IPv4Address("10.1.1.77")) and renewing.hwaddr is None
    assert relay.replies["vlan101"] == 4


def test_under_link_selection_the_circuit_id_finds_the_interface():
    relay = agent()
    out = relay.from_server(offer("10.0.0.9", option82=b"\x01\x04v102"), SERVER)
    assert out.interface == "vlan102"
    # the server dropped option 82: giaddr (the shared source) names no interface
    assert relay.from_server(offer("10.0.0.9"), SERVER) is None
    assert relay.dropped == {"no_route": 1}


@pytest.mark.parametrize(
    ("side", "make", "reason"),
    [
        ("client", lambda: discover(hops=4), "hops"),
        ("client", lambda: discover(giaddr=IPv4Address("10.1.2.1")), "loop"),
        (
            "client",
            lambda: build(Message(chaddr=MAC, options={53: b"\x01", 82: b"\x01\x01x"})),
            "untrusted_option82",
        ),
        ("client", lambda: offer("10.1.1.1"), "reply_on_client_side"),
        ("client", lambda: discover()[:200], "malformed"),
        ("server", lambda: discover(), "request_on_server_side"),
        ("server", lambda: offer("10.9.9.9"), "unknown_giaddr"),
        ("server", lambda: offer("10.1.1.1", option82=b"\x01\x04v102"), "circuit_mismatch"),
        ("server", lambda: offer("10.1.1.1", option82=b"\x01\x05other"), "circuit_mismatch"),
        ("server", lambda: offer("10.1.1.1")[:239], "malformed"),
    ],
)
def test_what_is_dropped_and_counted(side, make, reason):
    relay = agent()
    out = (relay.from_client(make(), "vlan101") if side == "client"
           else relay.from_server(make(), SERVER))  # fmt: skip
    assert out is None and relay.dropped == {reason: 1} and reason in REASONS


def test_a_reply_from_anyone_but_a_server_is_dropped():
    relay = agent()
    assert relay.from_server(offer("10.1.1.1"), SERVER + 5) is None
    # a client on the upstream link is no hostile server
    assert relay.from_server(discover(), 0) is None
    assert relay.dropped == {"not_a_server": 1, "request_on_server_side": 1}


def test_a_reply_of_the_server_in_this_process_needs_no_server_source():
    relay = agent()
    assert relay.owns(int(IPv4Address("10.0.0.9"))) and not relay.owns(SERVER)
    out = relay.from_server(offer("10.0.0.9", option82=b"\x01\x04v102"), 0, local=True)
    assert out is not None and out.interface == "vlan102"
    assert relay.from_server(offer("10.0.0.9"), 0) is None and relay.dropped == {"not_a_server": 1}


def test_a_request_relayed_before_keeps_its_giaddr_and_options():
    relay = agent()
    relayed = discover(giaddr=IPv4Address("10.50.0.1"), hops=1)
    sent = parse_untrusted(relay.from_client(relayed, "vlan101").payload)
    assert sent.giaddr == IPv4Address("10.50.0.1") and sent.hops == 2 and 82 not in sent.options


def test_a_trusted_circuit_keeps_the_clients_option_82_and_adds_none():
    relay = agent(trust_option82=True)
    msg = build(Message(chaddr=MAC, options={53: b"\x01", 82: b"\x01\x03sw1"}))
    sent = parse_untrusted(relay.from_client(msg, "vlan101").payload)
    assert sent.options[82] == b"\x01\x03sw1" and sent.giaddr == IPv4Address("10.1.1.1")


def test_no_room_for_option_82_forwards_without_it():
    big = build(Message(chaddr=MAC, options={53: b"\x01", 60: b"x" * 250, 77: b"y" * 250,
                                             43: b"z" * 250, 125: b"w" * 250,
                                             124: b"v" * 220}), max_size=1500)  # fmt: skip
    relay = agent()
    sent = relay.from_client(big, "vlan101").payload
    assert len(sent) <= 1472 and 82 not in parse_untrusted(sent).options
    assert relay.option82_skipped == 1


def test_circuit_id_reads_within_bounds():
    assert circuit_id(b"\x02\x01a\x01\x02bc") == b"bc"
    assert circuit_id(b"\x01\x09abc") is None and circuit_id(b"") is None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=700), st.integers(0, 255), st.integers(0, 2))
def test_any_bytes_on_either_side_are_relayed_well_formed_or_dropped(data, op, at):
    # a valid frame around random options, and random bytes alone
    framed = bytes((op % 3, 1, 6, 0)) + bytes(232) + b"\x63\x82\x53\x63" + data
    relay = agent()
    for payload in (data, framed):
        dropped = sum(relay.dropped.values())
        out = relay.from_client(payload, "vlan101")
        if out is not None:
            scan_untrusted(out.payload)  # what we send is well-formed
            assert out.payload[24:28] != bytes(4)
        assert (out is None) == (sum(relay.dropped.values()) == dropped + 1)
        back = relay.from_server(payload, SERVER)
        if back is not None:
            end, span82, _ = scan_untrusted(back.payload)
            assert span82 is None  # option 82 never reaches a client
