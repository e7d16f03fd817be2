"""The peer protocol with explicit time: handshake decisions, keepalives, liveness, garbage."""

from __future__ import annotations

import pytest

from appliance.cluster import wire
from appliance.cluster.session import (
    CallReceived,
    Closed,
    CrlReceived,
    Established,
    LocalInfo,
    Replied,
    RoleChanged,
    Session,
    negotiate,
)

A = LocalInfo("c" * 16, "a" * 16, "alpha", "r1", "active", "1.0", "192.0.2.1:7470", crl=2)
B = LocalInfo("c" * 16, "b" * 16, "beta", "r1", "standby", "1.1", "192.0.2.2:7470")


def pair(a=A, b=B, now=0.0, **kw):
    sa = Session(a, now, expected_node=b.node_id, **kw)
    sb = Session(b, now, expected_node=a.node_id, **kw)
    return sa, sb


def exchange(sa: Session, sb: Session, now: float) -> None:
    for _ in range(4):
        da, db = sa.data_to_send(), sb.data_to_send()
        if da:
            sb.receive_data(da, now)
        if db:
            sa.receive_data(db, now)


def events(session: Session) -> list:
    out = []
    while (e := session.next_event()) is not None:
        out.append(e)
    return out


def test_negotiate_picks_the_highest_common_version():
    assert negotiate(1, 3, 2, 5) == 3
    assert negotiate(1, 1, 1, 1) == 1
    assert negotiate(1, 1, 2, 3) is None


def test_handshake_establishes_both_ends():
    sa, sb = pair()
    exchange(sa, sb, 0.1)
    [ea], [eb] = events(sa), events(sb)
    assert isinstance(ea, Established) and ea.peer.name == "beta" and ea.proto == 2
    assert isinstance(eb, Established) and eb.peer.crl == 2 and eb.peer.addr == "192.0.2.1:7470"
    assert sa.established and sb.established


def test_incompatible_versions_are_refused_naming_both():
    future = LocalInfo(**{**B.__dict__, "version": "9.0", "proto_min": 5, "proto_max": 6})
    sa, sb = pair(b=future)
    exchange(sa, sb, 0.1)
    [ea], [eb] = events(sa), events(sb)
    assert isinstance(ea, Closed) and ea.refused
    assert "node aaaaaaaaaaaaaaaa runs rackboot 1.0 (cluster protocol 1-2)" in eb.reason
    assert "this node runs rackboot 9.0 (cluster protocol 5-6)" in eb.reason
    assert "update node aaaaaaaaaaaaaaaa to a version that speaks cluster protocol 5-6" in eb.reason
    assert "update this node to a version that speaks cluster protocol 5-6" in ea.reason
    assert isinstance(eb, Closed) and (eb.refused or eb.refused_by_peer)


def test_a_hello_that_contradicts_the_certificate_is_refused():
    sa = Session(A, 0.0, expected_node="f" * 16)
    sb = Session(B, 0.0, expected_node=A.node_id)
    exchange(sa, sb, 0.0)
    [ea] = events(sa)
    assert isinstance(ea, Closed) and ea.refused
    assert "certificate proves ffffffffffffffff" in ea.reason
    assert any(isinstance(e, Closed) and e.refused_by_peer for e in events(sb))


def test_another_cluster_and_ourselves_are_refused():
    other = LocalInfo(**{**B.__dict__, "cluster_id": "d" * 16})
    sa, sb = pair(b=other)
    exchange(sa, sb, 0)
    assert "peer says cluster" in events(sa)[0].reason
    me = Session(A, 0, expected_node=None)
    me2 = Session(A, 0, expected_node=None)
    exchange(me, me2, 0)
    assert events(me)[0].reason == "connected to ourselves"


def test_keepalives_and_liveness_with_explicit_time():
    sa, sb = pair(keepalive=1.0, dead_after=3.0)
    exchange(sa, sb, 0.0)
    events(sa), events(sb)
    assert sa.get_timer() == 1.0
    for t in (1.0, 2.0, 3.0, 4.0):  # both alive: pings and pongs flow, nobody closes
        sa.handle_timer(t)
        sb.handle_timer(t)
        exchange(sa, sb, t + 0.01)
    assert sa.closed is None and sb.closed is None and sa.pings == 4
    assert sa.rtt is not None and abs(sa.rtt - 0.01) < 1e-9
    # b goes silent: a keeps pinging, then closes dead_after seconds after the last message.
    last = sa.last_rx
    t = 5.0
    while sa.closed is None:
        t = sa.get_timer()
        sa.handle_timer(t)
        sa.data_to_send()
    assert t == last + 3.0
    assert sa.closed.reason == "no keepalive from peer for 3 s"
    assert sa.get_timer() is None


def test_a_peer_that_never_says_hello_is_dropped():
    sa = Session(A, 10.0, expected_node=None, dead_after=2.0)
    assert sa.get_timer() == 12.0
    sa.handle_timer(12.0)
    assert sa.closed.reason == "no hello from peer for 2 s"


def test_garbage_and_oversized_messages_close_without_raising():
    sa = Session(A, 0, expected_node=None, max_message=4096)
    sa.receive_data(wire.HEADER.pack(1 << 20), 0.1)
    [e] = events(sa)
    assert e.garbage and "cap is 4096" in e.reason
    sb = Session(A, 0, expected_node=None)
    sb.receive_data(wire.HEADER.pack(3) + b"\xc1\xc1\xc1", 0.1)
    assert events(sb)[0].garbage
    sb.receive_data(b"more", 0.2)  # after closing, input is ignored
    assert events(sb) == []


def test_messages_before_hello_are_refused():
    sa = Session(A, 0, expected_node=None)
    sa.receive_data(wire.encode({"t": "ping", "n": 1, "role": "x"}), 0)
    [e] = events(sa)
    assert e.refused and e.reason == "expected hello, got ping"
    hello, refuse = wire.FrameReader().feed(sa.data_to_send())
    assert hello["t"] == "hello" and refuse == {"t": "refuse", "reason": e.reason}


def test_role_updates_and_revocation_lists_arrive_as_events():
    sa, sb = pair()
    exchange(sa, sb, 0)
    events(sa), events(sb)
    sb.set_role("active")
    sb.handle_timer(sb.next_ping)
    sb.send_crl(b"DER")
    exchange(sa, sb, 1.0)
    assert events(sa) == [RoleChanged("active"), CrlReceived(b"DER")]
    assert sa.peer.role == "active"


def test_peer_close_is_an_event():
    sa, sb = pair()
    exchange(sa, sb, 0)
    events(sa)
    sa.receive_data(b"", 1)
    assert events(sa) == [Closed("peer closed the connection")]


def _ping_pong(sa: Session, sb: Session, *, sent: tuple, answered: tuple, back: tuple) -> None:
    """One ping of ``sa`` at (monotonic, wall) ``sent``, answered by ``sb`` at ``answered``,
    the pong back at ``back``: each end's own clocks, given explicitly."""
    pings = sa.pings
    sa.handle_timer(sent[0], wall=sent[1])
    assert sa.pings == pings + 1
    sb.receive_data(sa.data_to_send(), answered[0], answered[1])
    sa.receive_data(sb.data_to_send(), back[0], back[1])


def test_a_pong_carries_the_peer_wall_clock_and_the_pinger_measures_skew():
    sa, sb = pair(keepalive=1.0)
    exchange(sa, sb, 0.0)
    assert sa.clock_skew is None
    # b's wall clock runs 2.5 s ahead of a's; the round trip takes 40 ms, 20 ms each way.
    _ping_pong(sa, sb, sent=(1.0, 1000.0), answered=(1.02, 1002.52), back=(1.04, 1000.04))
    assert abs(sa.rtt - 0.04) < 1e-9
    assert abs(sa.clock_skew - 2.5) < 1e-9
    assert sb.clock_skew is None  # b measures with its own pings
    _ping_pong(sb, sa, sent=(1.0, 1003.0), answered=(1.05, 1000.51), back=(1.02, 1003.02))
    assert abs(sb.clock_skew + 2.5) < 1e-9


def test_no_skew_from_an_old_peer_a_bad_value_or_a_clock_stepped_mid_ping():
    sa, sb = pair(keepalive=1.0)
    exchange(sa, sb, 0.0)
    # an older peer answers without its wall time (a pong of n only): rtt, no skew
    sb.receive_data(wire.encode({"t": "ping", "n": 7, "role": "active"}), 0.5)
    assert wire.FrameReader().feed(sb.data_to_send()) == [{"t": "pong", "n": 7}]
    sa.handle_timer(sa.next_ping, wall=1000.0)
    sa.data_to_send()
    sa.receive_data(wire.encode({"t": "pong", "n": sa.pings}), 1.01, 1000.01)
    assert sa.rtt is not None and sa.clock_skew is None
    for bad in ("1000.0", float("nan"), float("inf"), True, None):
        sa.handle_timer(sa.next_ping, wall=1001.0)
        sa.data_to_send()
        sa.receive_data(wire.encode({"t": "pong", "n": sa.pings, "w": bad}), sa.next_ping - 0.99,
                        1001.01)  # fmt: skip
        assert sa.closed is None and sa.clock_skew is None, bad
    # our wall clock jumped an hour while the ping was out: the sample measures nothing
    t = sa.next_ping
    _ping_pong(sa, sb, sent=(t, 2000.0), answered=(t, 2000.01), back=(t + 0.02, 5600.02))
    assert sa.clock_skew is None
    t = sa.next_ping
    _ping_pong(sa, sb, sent=(t, 5601.0), answered=(t, 5601.01), back=(t + 0.02, 5601.02))
    assert abs(sa.clock_skew) < 1e-9


def test_a_request_is_answered_on_cluster_protocol_2():
    sa, sb = pair()
    exchange(sa, sb, 0.1)
    events(sa), events(sb)
    sa.call(7, "roll.state", {"roll": "r1"})
    exchange(sa, sb, 0.2)
    [call] = events(sb)
    assert call == CallReceived(7, "roll.state", {"roll": "r1"})
    sb.reply(7, True, {"version": "1.1"})
    sb.reply(8, False, error="no such roll")
    exchange(sa, sb, 0.3)
    assert events(sa) == [
        Replied(7, True, {"version": "1.1"}, ""),
        Replied(8, False, None, "no such roll"),
    ]


def test_a_peer_on_protocol_1_is_sent_no_request_and_may_send_none():
    old = LocalInfo(**{**B.__dict__, "version": "0.1.0", "proto_min": 1, "proto_max": 1})
    sa, sb = pair(b=old)
    exchange(sa, sb, 0.1)
    events(sa), events(sb)
    assert sa.proto == 1 and sa.established
    with pytest.raises(ValueError, match=r"rackboot 0.1.0 \(cluster protocol 1\), which takes no"):
        sa.call(1, "roll.state", {})
    sb._send({"t": "call", "id": 1, "cmd": "roll.state", "args": {}})  # as a confused peer
    exchange(sa, sb, 0.2)
    assert any(isinstance(e, Closed) and "unexpected call" in e.reason for e in events(sa))
