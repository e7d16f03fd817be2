"""The etcd backend's decisions with explicit time: what it asks etcd, what answers mean."""

from __future__ import annotations

import pytest

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


OURS = [
    {"key": b64("/l/rack1"), "target": "CREATE", "create_revision": "7"},
    {"key": b64("/l/rack1"), "target": "VALUE", "value": b64("a")},
    {"key": b64("/l/rack1"), "target": "LEASE", "lease": "42"},
]
GONE = {"header": {"revision": "9"}, "responses": [{"response_range": {"header": {}}}]}


def keepalive(machine: EtcdLease, sent: float, answered: float) -> None:
    request = machine.next_request(sent)
    assert request.kind == "keepalive" and request.body == {"ID": "42"}
    machine.on_response({"result": {"ID": "42", "TTL": "2"}}, answered)


def held_by(value: str, create: int, lease: str | None = None) -> dict:
    kv = {"key": b64("/l/rack1"), "create_revision": str(create), "value": b64(value)}
    kv |= {"lease": lease} if lease else {}
    return {"header": {}, "responses": [{"response_range": {"header": {}, "kvs": [kv]}}]}


def test_a_renewal_is_a_keepalive_then_a_txn_that_the_key_is_still_ours():
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    machine.events.clear()
    keepalive(machine, 0.27, 0.28)
    assert not machine.events  # the lease is extended, the key not yet checked
    check = machine.next_request(0.28)
    assert (check.kind, check.path) == ("check", "/v3/kv/txn")
    assert check.body["compare"] == OURS and "success" not in check.body
    machine.on_response({"header": {"revision": "8"}, "succeeded": True}, 0.29)
    # from the moment the keepalive was sent: 0.27 + 2 s TTL - 0.15 margin
    assert machine.events.popleft() == Renewed(7, 0.27 + 2 - 0.15)
    assert machine.next_request(0.29) is None and machine.next_request(0.52).kind == "keepalive"


def test_a_slow_check_extends_validity_only_from_the_keepalives_time():
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    machine.events.clear()
    keepalive(machine, 0.27, 0.45)
    assert machine.next_request(0.45).kind == "check" and not machine.events
    machine.on_response({"succeeded": True}, 0.69)  # just within its round
    assert machine.events.popleft() == Renewed(7, 0.27 + 2 - 0.15)
    assert machine.valid_until == 0.27 + 2 - 0.15


def test_a_good_keepalive_with_a_failed_check_extends_nothing_and_retries_both():
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    machine.events.clear()
    keepalive(machine, 0.27, 0.28)
    assert machine.next_request(0.28).kind == "check"
    machine.handle_timer(0.28 + Timing().round_timeout)  # no answer
    assert not machine.events and machine.valid_until == 0.01 + 2 - 0.15
    assert machine.last_refusal == "check failed" and machine.holding(0.6)
    retry = machine.get_timer()
    assert retry == pytest.approx(0.53 + 0.25 / 4)  # a quarter of renew after the failure
    keepalive(machine, retry, retry + 0.01)
    machine.next_request(retry + 0.01)
    machine.on_response({"succeeded": True}, retry + 0.02)
    assert machine.events.popleft() == Renewed(7, retry + 2 - 0.15)


@pytest.mark.parametrize(
    "answer, seen",
    [
        (GONE, ""),  # deleted
        (held_by("a", 7), "a"),  # overwritten by a plain put: same create_revision, no lease
        (held_by("someone", 7, "42"), "someone"),  # overwritten value, same lease
        (held_by("b", 9, "77"), "b"),  # deleted and taken by another node
    ],
    ids=["deleted", "overwritten", "value-overwritten", "recreated-by-other"],
)
def test_a_key_no_longer_ours_steps_down_at_once_and_revokes_the_lease(answer, seen):
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    machine.events.clear()
    keepalive(machine, 0.27, 0.28)
    machine.next_request(0.28)
    machine.on_response(answer, 0.29)
    assert list(machine.events) == [Lost(7, "key-lost")] and not machine.holding(0.29)
    assert (machine.last_refusal, machine.holder_seen) == ("key-lost", seen)
    revoke = machine.next_request(0.29)
    assert (revoke.kind, revoke.body) == ("revoke", {"ID": "42"})
    machine.on_response({"header": {}}, 0.30)
    # no new lease in the same breath: a candidate again, it reads the key next renew
    assert machine.next_request(0.30) is None and machine.get_timer() == 0.27 + 0.25
    assert machine.next_request(0.52).kind == "range"


def test_a_check_answer_after_stepping_down_revives_nothing():
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    machine.events.clear()
    keepalive(machine, 0.27, 0.28)
    machine.next_request(0.28)
    machine.handle_timer(2.0)  # validity ended meanwhile
    assert machine.events.popleft() == Lost(7, "expired")
    machine.on_response({"succeeded": True}, 2.0)
    assert not machine.events and not machine.holding(2.0)


def test_releasing_with_a_check_pending_sends_the_revoke_first():
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    keepalive(machine, 0.27, 0.28)
    assert [r.kind for r in machine.pending] == ["check"]
    machine.release(0.28, "released")
    assert machine.next_request(0.28).kind == "revoke"


def test_a_lease_gone_steps_down():
    machine = EtcdLease("a", "/l/rack1", Timing(), 0.0)
    take(machine)
    machine.events.clear()
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
