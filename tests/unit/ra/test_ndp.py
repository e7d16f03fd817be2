"""The ``ra`` plugin's sans-IO core (plugins/ra/ndp.py): what it parses, builds, answers
and when it stays quiet, with explicit time. scapy is the independent oracle of the
wire format (it builds what we parse and parses what we build)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scapy.layers.inet6 import (
    ICMPv6ND_RA,
    ICMPv6ND_RS,
    ICMPv6NDOptMTU,
    ICMPv6NDOptPrefixInfo,
    ICMPv6NDOptRDNSS,
    ICMPv6NDOptSrcLLAddr,
)

from plugins.ra.ndp import (
    ALL_NODES,
    ALL_ROUTERS,
    BURST,
    MAX_MESSAGE,
    RATE,
    REASONS,
    UNSPECIFIED,
    Malformed,
    Policy,
    Responder,
    build_advertisement,
    build_solicitation,
    parse_advertisement_untrusted,
    parse_solicitation_untrusted,
)
from tests.unit.test_architecture import violations

MAC = bytes.fromhex("525400aabbcc")
HOST = bytes.fromhex("fe80000000000000505400fffe6e6201")  # a host's link-local address
ROUTER = bytes.fromhex("fe800000000000000000000000000001")
GLOBAL = bytes.fromhex("20010db8000000000000000000000001")


def rs(*, code: int = 0, lladdr: str | None = "52:54:00:6e:62:01") -> bytes:
    packet = ICMPv6ND_RS(code=code, cksum=0)  # the kernel checks checksums: none here
    return bytes(packet / ICMPv6NDOptSrcLLAddr(lladdr=lladdr) if lladdr else packet)


def ra(lifetime: int = 1800, *options, **fields) -> bytes:
    packet = ICMPv6ND_RA(routerlifetime=lifetime, cksum=0, **fields)
    for option in options:
        packet = packet / option
    return bytes(packet)


def test_the_core_is_sans_io() -> None:
    assert violations("plugins.ra.ndp") == []


def test_the_advertisement_routes_nothing_and_names_our_address() -> None:
    parsed = ICMPv6ND_RA(build_advertisement(MAC))
    assert (parsed.type, parsed.code, parsed.routerlifetime, parsed.M, parsed.O) == (
        134,
        0,
        0,
        0,
        0,
    )
    assert (parsed.chlim, parsed.reachabletime, parsed.retranstimer) == (0, 0, 0)
    assert parsed[ICMPv6NDOptSrcLLAddr].lladdr == "52:54:00:aa:bb:cc"
    assert not parsed.haslayer(ICMPv6NDOptPrefixInfo)
    assert len(build_advertisement(None)) == 16  # no link-layer address: no option


def test_the_solicitation_is_one_scapy_reads() -> None:
    parsed = ICMPv6ND_RS(build_solicitation(MAC))
    assert (parsed.type, parsed.code) == (133, 0)
    assert parsed[ICMPv6NDOptSrcLLAddr].lladdr == "52:54:00:aa:bb:cc"


def test_a_valid_solicitation_parses() -> None:
    assert parse_solicitation_untrusted(rs(), HOST, 255).source_ll == bytes.fromhex("5254006e6201")
    assert parse_solicitation_untrusted(rs(lladdr=None), UNSPECIFIED, 255).source_ll is None


@pytest.mark.parametrize(
    ("data", "source", "hop_limit", "reason"),
    [
        (rs(), HOST, 64, "hop_limit"),  # routed here: not from this link
        (rs(), HOST, None, "hop_limit"),
        (rs(code=1), HOST, 255, "code"),
        (rs()[:6], HOST, 255, "too_short"),
        (rs() + bytes(MAX_MESSAGE), HOST, 255, "too_long"),
        (rs(lladdr=None) + b"\x01\x00" + bytes(6), HOST, 255, "bad_option"),  # length 0
        (rs(lladdr=None) + b"\x01\x02" + bytes(6), HOST, 255, "bad_option"),  # past the end
        (rs(lladdr=None) + b"\x01", HOST, 255, "bad_option"),
        (rs(), UNSPECIFIED, 255, "unspecified_with_address"),  # RFC 4861 §6.1.1
    ],
)
def test_a_broken_solicitation_is_refused(data, source, hop_limit, reason) -> None:
    with pytest.raises(Malformed) as caught:
        parse_solicitation_untrusted(data, source, hop_limit)
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("data", "configures"),
    [
        (ra(1800), True),  # a default router
        (ra(0, ICMPv6NDOptPrefixInfo(prefix="2001:db8::", prefixlen=64)), True),  # a prefix
        (ra(0, M=1), True),  # DHCPv6 for addresses
        (ra(0, O=1), True),  # DHCPv6 for other configuration
        (ra(0, ICMPv6NDOptRDNSS(dns=["2001:db8::53"])), True),
        (ra(0, ICMPv6NDOptSrcLLAddr(lladdr="52:54:00:00:00:09"), ICMPv6NDOptMTU(mtu=1500)), False),
        (build_advertisement(MAC), False),  # ours, or the rack peer's
    ],
)
def test_what_counts_as_another_router(data, configures) -> None:
    assert parse_advertisement_untrusted(data, ROUTER, 255).configures is configures


def test_an_advertisement_must_come_from_a_link_local_address() -> None:
    with pytest.raises(Malformed) as caught:
        parse_advertisement_untrusted(ra(1800), GLOBAL, 255)
    assert caught.value.reason == "not_link_local"


def auto(listen: float = 2.0, hold: float = 100.0, now: float = 0.0) -> tuple[Responder, list]:
    responder = Responder(Policy("auto", listen, hold), MAC)
    return responder, responder.start(now)


def test_auto_solicits_listens_then_answers_each_host_alone() -> None:
    responder, sent = auto()
    assert [(s.payload, s.destination) for s in sent] == [(build_solicitation(MAC), ALL_ROUTERS)]
    assert responder.state == "probing" and responder.deadline() == 2.0
    assert responder.receive(rs(), HOST, 255, 1.0) == []  # still listening: quiet
    assert responder.tick(1.9) == [] and responder.state == "probing"
    assert responder.tick(2.0) == [] and responder.state == "answering"
    assert responder.deadline() is None
    (answer,) = responder.receive(rs(), HOST, 255, 3.0)
    assert (answer.payload, answer.destination) == (build_advertisement(MAC), HOST)
    (answer,) = responder.receive(rs(lladdr=None), UNSPECIFIED, 255, 3.0)
    assert answer.destination == ALL_NODES  # no address to answer to: every node
    (answer,) = responder.receive(rs(), GLOBAL, 255, 3.0)
    assert answer.destination == ALL_NODES  # not link-local: no route needed
    assert responder.counts["answered"] == 3 and responder.counts["not_answered"] == 1


def test_auto_stays_quiet_where_a_router_answers_the_probe() -> None:
    responder, _ = auto()
    assert responder.receive(ra(1800), ROUTER, 255, 0.3) == []
    assert responder.state == "quiet" and responder.deadline() == 100.3
    assert responder.tick(2.0) == [] and responder.state == "quiet"
    assert responder.receive(rs(), HOST, 255, 5.0) == []
    status = responder.status(5.0)
    assert status["router"] == "fe80::1" and status["router_seen_ago"] == 4.7
    assert status["not_answered"] == 1 and status["answered"] == 0


def test_auto_falls_quiet_when_a_router_appears_and_probes_after_hold() -> None:
    responder, _ = auto()
    responder.tick(2.0)
    assert len(responder.receive(rs(), HOST, 255, 10.0)) == 1
    responder.receive(ra(0, ICMPv6NDOptPrefixInfo(prefix="2001:db8::")), ROUTER, 255, 20.0)
    assert responder.state == "quiet"
    assert responder.receive(rs(), HOST, 255, 21.0) == []
    responder.receive(ra(1800), ROUTER, 255, 90.0)  # the router again: quiet longer
    assert responder.deadline() == 190.0
    (probe,) = responder.tick(190.0)  # silent for hold: is it gone?
    assert probe.destination == ALL_ROUTERS and responder.state == "probing"
    assert responder.tick(192.0) == [] and responder.state == "answering"
    assert len(responder.receive(rs(), HOST, 255, 193.0)) == 1


def test_an_empty_advertisement_silences_nobody() -> None:
    """The other appliance of the rack answers the same solicitations: no router."""
    responder, _ = auto()
    responder.receive(build_advertisement(bytes(6)), ROUTER, 255, 0.5)
    responder.tick(2.0)
    assert responder.state == "answering"
    assert responder.counts["empty_advertisements"] == 1


def test_a_forged_advertisement_from_off_link_silences_nobody() -> None:
    responder, _ = auto(listen=0.0)
    responder.receive(ra(1800), ROUTER, 254, 1.0)  # hop limit 254: routed here
    responder.receive(ra(1800), GLOBAL, 255, 1.0)
    assert responder.state == "answering"
    assert responder.dropped == {"hop_limit": 1, "not_link_local": 1}


def test_always_answers_at_once_whatever_else_advertises() -> None:
    responder = Responder(Policy("always"), None)
    assert responder.start(0.0) == []
    responder.receive(ra(1800), ROUTER, 255, 0.1)
    (answer,) = responder.receive(rs(), HOST, 255, 0.2)
    assert answer.payload == build_advertisement(None)
    assert responder.state == "answering" and responder.status(0.2)["router"] == "fe80::1"


def test_a_flood_of_solicitations_is_answered_at_a_bounded_rate() -> None:
    responder = Responder(Policy("always"), MAC)
    responder.start(0.0)
    answers = sum(len(responder.receive(rs(), HOST, 255, 0.0)) for _ in range(100))
    assert answers == BURST and responder.counts["rate_limited"] == 100 - BURST
    later = sum(len(responder.receive(rs(), HOST, 255, 1.0)) for _ in range(100))
    assert later == RATE


@given(data=st.binary(max_size=MAX_MESSAGE + 16), source=st.sampled_from([HOST, UNSPECIFIED,
       GLOBAL, ROUTER]), hop_limit=st.sampled_from([255, 64, None]), mode=st.sampled_from(["auto",
       "always"]))  # fmt: skip
def test_garbage_never_raises_and_only_our_advertisement_leaves(data, source, hop_limit, mode):
    responder = Responder(Policy(mode, listen=0.0), MAC)
    responder.start(0.0)
    sent = responder.receive(data, source, hop_limit, 1.0)
    assert all(s.payload == build_advertisement(MAC) for s in sent)
    handled = responder.counts["solicitations"] + responder.counts["router_advertisements"]
    handled += responder.counts["empty_advertisements"] + sum(responder.dropped.values())
    assert handled == 1 and set(responder.dropped) <= set(REASONS)


@given(
    kind=st.sampled_from([133, 134]),
    options=st.lists(
        st.tuples(st.integers(0, 255), st.integers(0, 4), st.binary(max_size=40)), max_size=8
    ),
)
def test_any_option_layout_parses_or_is_refused_by_name(kind, options):  # fmt: skip
    header = bytes((kind, 0)) + bytes(6 if kind == 133 else 14)
    data = header + b"".join(bytes((t, n)) + body for t, n, body in options)
    try:
        parse = parse_solicitation_untrusted if kind == 133 else parse_advertisement_untrusted
        parse(data, HOST, 255)
    except Malformed as exc:
        assert exc.reason in REASONS
