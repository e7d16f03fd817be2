"""The peer table with explicit time and a seeded RNG: sources, liveness, backoff."""

from __future__ import annotations

import random

from appliance.cluster.peers import DOWN, REFUSED, UP, Backoff, PeerTable

ME, FP = "0" * 16, "f" * 16


def table(seed=1) -> PeerTable:
    return PeerTable(ME, FP, rng=random.Random(seed), backoff=Backoff(0.5, 8.0))


def test_static_peer_is_rekeyed_by_the_node_id_it_proves():
    t = table()
    t.add_static("192.0.2.2:7470")
    t.add_static("192.0.2.2:7470")  # no duplicate
    [peer] = t.due(0.0)
    t.dialing(peer)
    assert t.due(0.0) == []  # connecting: not dialled twice
    entry = t.established(peer, "b" * 16, {"name": "beta", "rack": "r1"}, 1.0, 1000.0)
    assert entry.key == "b" * 16 and entry.state == UP and entry.name == "beta"
    assert list(t.peers) == ["b" * 16]


def test_announcements_of_ourselves_and_other_clusters_are_ignored():
    t = table()
    assert not t.discovered(ME, FP, "192.0.2.1:7470", {})
    assert not t.discovered("b" * 16, "e" * 16, "192.0.2.9:7470", {"name": "intruder"})
    assert t.peers == {} and t.ignored_other_cluster == 1
    assert t.discovered("b" * 16, FP, "192.0.2.2:7470", {"name": "beta", "rack": "r1"})
    assert t.peers["b" * 16].sources == {"mdns"}


def test_an_mdns_peer_merges_with_its_static_entry():
    t = table()
    t.add_static("192.0.2.2:7470")
    t.discovered("b" * 16, FP, "192.0.2.2:7470", {"name": "beta"})
    assert list(t.peers) == ["b" * 16]
    assert t.peers["b" * 16].sources == {"mdns", "static"}


def test_backoff_grows_is_jittered_and_bounded():
    t = table(seed=7)
    t.add_static("192.0.2.2:7470")
    peer = next(iter(t.peers.values()))
    now, waits = 0.0, []
    for _ in range(10):
        t.dialing(peer)
        due = t.failed(peer, "connection refused", now)
        waits.append(due - now)
        assert t.due(now) == [] and t.next_deadline() == due
        now = due
        assert t.due(now) == [peer]
    for i, w in enumerate(waits):
        full = min(8.0, 0.5 * 2**i)
        assert full / 2 <= w <= full
    assert max(waits) <= 8.0 and peer.state == DOWN
    # Same seed, same schedule: tests are deterministic.
    t2 = table(seed=7)
    t2.add_static("192.0.2.2:7470")
    p2 = next(iter(t2.peers.values()))
    assert [round(t2.failed(p2, "x", 0.0), 9) for _ in range(3)] == [round(w, 9) for w in waits[:3]]


def test_a_peer_that_stops_answering_is_down_then_reconnected():
    t = table()
    t.add_static("192.0.2.2:7470")
    peer = t.due(0)[0]
    t.dialing(peer)
    peer = t.established(peer, "b" * 16, {"name": "beta"}, 1.0, 1001.0)
    assert t.up() == [peer] and t.snapshot(2.0)[0]["health"] == "online"
    t.failed(peer, "no keepalive from peer for 3 s", 4.0)
    [row] = t.snapshot(10.0)
    assert row["health"] == "offline" and row["last_seen_ago"] == 9.0
    assert row["reason"] == "no keepalive from peer for 3 s"
    assert peer.attempts == 1 and 4.25 <= peer.next_attempt <= 4.5  # reconnect soon
    t.dialing(peer)
    t.established(peer, "b" * 16, {}, 5.0, 1005.0)
    assert peer.state == UP and peer.attempts == 0


def test_refused_peers_are_kept_with_their_reason():
    t = table()
    t.add_static("192.0.2.3:7470")
    peer = t.due(0)[0]
    t.failed(peer, "refused: node x is revoked", 0, refused=True)
    assert peer.state == REFUSED and t.snapshot(1)[0]["reason"].startswith("refused")


def test_inbound_hello_teaches_an_address_to_dial_back():
    t = table()
    t.seen("c" * 16, 1.0, 1001.0, {"name": "gamma", "addr": "192.0.2.3:7470"})
    t.inbound("c" * 16, +1)
    peer = t.peers["c" * 16]
    assert peer.address == "192.0.2.3:7470" and "inbound" in peer.sources
    assert t.due(1.0) == [peer]
    t.seen(ME, 1.0, 1001.0, {})  # never ourselves
    assert ME not in t.peers


def test_the_table_is_bounded():
    t = PeerTable(ME, FP, rng=random.Random(1), max_peers=2)
    for i in range(5):
        t.discovered(f"{i:016x}", FP, f"192.0.2.{i}:1", {})
    assert len(t.peers) == 2
