"""The etcd backend's decisions with explicit time: what it asks etcd, what answers mean."""

from __future__ import annotations

from appliance.ha.etcd_lease import EtcdLease, b64
from appliance.ha.proposer import Acquired, Lost, Renewed
from appliance.ha.schema import Timing


def take(machine: EtcdLease, now: float = 0.0, revision: int = 7) -> None:
    assert machine.next_request(now).kind == "range"
    machine.on_response({"header": {"revision": "3"}}, now + 0.01)  # no key: free
    grant = machine.next_request(now + 0.01)
    assert (grant.kind, grant.body) == ("grant", {"TTL": 1})
    machine.on_response({"ID": "42", "TTL": "2"}, now + 0.02)
    txn = machine.next_request(now + 0.02)
    assert txn.kind == "txn"
    assert txn.body["success"][0]["request_put"] == {"key": b64("/l/rack1"), "value": b64("a"),
                                                     "lease": "42"}  # fmt: skip
    machine.on_response({"succeeded": True, "header": {"revision": str(revision)}}, now + 0.03)


def test_a_free_key_is_taken_with_the_put_revision_as_epoch():
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    (event,) = machine.events
    # valid from the moment the grant was asked for: 0.01 + 2 s TTL - 0.15 margin
    assert event == Acquired(7, 0.01 + 2 - 0.15)


def test_keepalives_renew_and_a_lease_gone_steps_down():
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    machine.events.clear()
    request = machine.next_request(0.27)
    assert request.kind == "keepalive" and request.body == {"ID": "42"}
    machine.on_response({"result": {"ID": "42", "TTL": "2"}}, 0.28)
    assert machine.events.popleft() == Renewed(7, 0.27 + 2 - 0.15)
    machine.next_request(0.52)
    machine.on_response({"result": {"ID": "42"}}, 0.53)  # no TTL: etcd forgot the lease
    assert machine.events.popleft() == Lost(7, "expired") and not machine.holding(0.53)


def test_a_holder_etcd_no_longer_answers_steps_down_before_its_validity_ends():
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    machine.events.clear()
    now = 0.25
    while not machine.events:
        machine.handle_timer(now)
        if machine.next_request(now) is not None:
            machine.on_response(None, now + 0.25)  # timed out
        now += 0.01
    assert machine.events[0] == Lost(7, "expired")
    assert now <= 0.01 + 2 - 0.15 - Timing().step_down_lead + 0.02


def test_a_taken_key_is_left_alone_and_a_lost_race_revokes_its_lease():
    machine = EtcdLease("b", "/l/rack1", Timing(), 0.0)
    machine.next_request(0.0)
    machine.on_response({"kvs": [{"value": b64("a")}]}, 0.01)
    assert machine.next_request(0.01) is None and machine.holder_seen == "a"
    machine.next_request(0.25)
    machine.on_response({}, 0.26)
    machine.next_request(0.26)
    machine.on_response({"ID": "9", "TTL": "2"}, 0.27)
    machine.next_request(0.27)
    machine.on_response({"responses": []}, 0.28)  # someone else put it first
    revoke = machine.next_request(0.28)
    assert (revoke.kind, revoke.body) == ("revoke", {"ID": "9"}) and not machine.events


def test_demote_and_maintenance_release_the_lease():
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    machine.demote(0.3)
    assert machine.events[-1] == Lost(7, "released")
    assert machine.next_request(0.3).kind == "revoke"
    machine.on_response({}, 0.31)
    assert machine.next_request(0.6) is None  # held back after a demote
    machine.set_maintenance(True, 0.6)
    assert machine.get_timer() is None
