"""The election on an etcd lease (sans-IO): requests to etcd's v3 JSON gateway out,
its answers and ``now`` in, the same events as the embedded election.

* Candidate, every ``renew`` seconds: ``/v3/kv/range`` on the leader key; if
  it is absent, ``/v3/lease/grant`` (the time is noted *before* asking), then
  ``/v3/kv/txn``: put the key with the lease if its ``create_revision`` is 0.
  Success makes this node the holder, the put's revision (the key's
  ``create_revision``) is the **epoch**: etcd's revisions only rise.
* Holder, every ``renew`` seconds: ``/v3/lease/keepalive``, time noted before
  asking, then ``/v3/kv/txn`` comparing the leader key's ``create_revision``
  (the epoch), value (this node) and lease (ours). Both good: valid until the
  keepalive's time + the TTL etcd answered - ``margin``. No TTL in the answer
  (the lease is gone) or a failed comparison (the key was deleted,
  overwritten or taken by another node): step down at once ("key-lost"
  revokes our lease too) and read the key as a candidate at the next renew.
* Release: ``/v3/lease/revoke`` (the key goes with the lease), after stepping down.

etcd grants whole seconds and at least its own minimum (2 s with default
settings), so failover on etcd takes ~2 s: the price of an external store.
One request is in flight at a time; a request that fails or times out is
retried, and a holder that cannot renew steps down before its validity ends.
"""

from __future__ import annotations

import base64
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from appliance.ha.proposer import Acquired, Event, LeaseTimes, Lost, Renewed
from appliance.ha.schema import Timing


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@dataclass(frozen=True)
class Request:
    kind: str  # range, grant, txn, keepalive, check, revoke
    path: str
    body: dict[str, Any]


class EtcdLease(LeaseTimes):
    def __init__(self, me: str, key: str, timing: Timing, now: float, *, maintenance=False):
        self.me = me
        self.key = key
        self.timing = timing
        self.ttl = max(1, math.ceil(timing.lease))
        self.maintenance = maintenance
        self.lease_id: str | None = None
        self.granted_at = 0.0  # when the grant of lease_id was asked for
        self.granted_ttl = 0
        self.valid_until: float | None = None
        self.epoch = 0
        self.kept_alive: tuple[float, int] = (0.0, 0)  # (sent, TTL) of this renewal's keepalive
        self.next_at = now
        self.holdoff_until = 0.0
        self.in_flight: tuple[Request, float] | None = None
        self.pending: deque[Request] = deque()
        self.events: deque[Event] = deque()
        self.holder_seen = ""
        self.last_refusal = ""
        self.errors = 0

    # -- queries ----------------------------------------------------------------

    def get_timer(self) -> float | None:
        times = self._step_down_times()
        if self.in_flight is not None:
            times.append(self.in_flight[1] + self.timing.round_timeout)
        elif self.pending:
            times.append(0.0)
        elif self.valid_until is not None or not self.maintenance:
            times.append(max(self.next_at, self.holdoff_until))
        return min(times) if times else None

    # -- the shell's side ---------------------------------------------------------

    def next_request(self, now: float) -> Request | None:
        """The request to send now, if any (call after :meth:`handle_timer`)."""
        if self.in_flight is not None:
            return None
        request = self.pending.popleft() if self.pending else None
        if request is None and now >= max(self.next_at, self.holdoff_until):
            if self.holding(now):
                request = Request("keepalive", "/v3/lease/keepalive", {"ID": self.lease_id})
            elif not self.maintenance:
                request = Request("range", "/v3/kv/range", {"key": b64(self.key)})
            if request is not None:
                self.next_at = now + self.timing.renew
        if request is not None:
            self.in_flight = (request, now)
        return request

    def handle_timer(self, now: float) -> None:
        if self.valid_until is not None and now >= self.valid_until - self.timing.step_down_lead:
            self._lose("expired")
        if self.in_flight is not None and now >= self.in_flight[1] + self.timing.round_timeout:
            self.on_response(None, now)

    def on_response(self, body: dict[str, Any] | None, now: float) -> None:
        """etcd's JSON answer to the request in flight; None when it failed."""
        if self.in_flight is None:
            return
        request, sent = self.in_flight
        self.in_flight = None
        if body is None:
            self.errors += 1
            self.last_refusal = f"{request.kind} failed"
            if self.holding(now):
                self.next_at = now + self.timing.renew / 4
            return
        getattr(self, f"_{request.kind}")(body, sent, now)

    # -- answers ------------------------------------------------------------------

    def _range(self, body: dict, sent: float, now: float) -> None:
        kvs = body.get("kvs") or []
        if kvs:
            self.holder_seen = _text(kvs[0].get("value", ""))
            self.last_refusal = "busy"
            return
        self.pending.append(Request("grant", "/v3/lease/grant", {"TTL": self.ttl}))

    def _grant(self, body: dict, sent: float, now: float) -> None:
        if "ID" not in body:
            self.last_refusal = "no lease granted"
            return
        self.lease_id, self.granted_at = str(body["ID"]), sent
        self.granted_ttl = int(body.get("TTL", 0))
        key = b64(self.key)
        txn = {
            "compare": [{"key": key, "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": b64(self.me), "lease": self.lease_id}}],
            "failure": [{"request_range": {"key": key}}],
        }  # fmt: skip
        self.pending.append(Request("txn", "/v3/kv/txn", txn))

    def _txn(self, body: dict, sent: float, now: float) -> None:
        if not body.get("succeeded"):
            self.last_refusal = "busy"
            self._revoke_unused()
            return
        valid_until = self.granted_at + self.granted_ttl - self.timing.margin
        if now >= valid_until - self.timing.step_down_lead:
            self.last_refusal = "granted too late"
            self._revoke_unused()
            return
        self.epoch = int(body.get("header", {}).get("revision", 0))
        self.valid_until = valid_until
        self.holder_seen, self.last_refusal = self.me, ""
        self.next_at = sent + self.timing.renew
        self.events.append(Acquired(self.epoch, valid_until))

    def _keepalive(self, body: dict, sent: float, now: float) -> None:
        ttl = int((body.get("result") or body).get("TTL", 0))
        if ttl <= 0:
            self._lose("expired")
            self.lease_id = None
            return
        if not self.holding(now):
            return  # stepped down meanwhile: a late answer revives nothing
        # Check the key *after* the lease was extended: if it is still ours then, it
        # lives (untouched) until the lease does. Validity waits for both answers.
        self.kept_alive = (sent, ttl)
        self.pending.append(Request("check", "/v3/kv/txn", self._ownership_txn()))

    def _ownership_txn(self) -> dict[str, Any]:
        # create_revision alone misses an overwrite (a plain put keeps it): compare
        # the value and the lease too
        key = b64(self.key)
        return {
            "compare": [
                {"key": key, "target": "CREATE", "create_revision": str(self.epoch)},
                {"key": key, "target": "VALUE", "value": b64(self.me)},
                {"key": key, "target": "LEASE", "lease": self.lease_id},
            ],
            "failure": [{"request_range": {"key": key}}],
        }

    def _check(self, body: dict, sent: float, now: float) -> None:
        if not self.holding(now):
            return
        if not body.get("succeeded"):
            self._key_lost(body)
            return
        kept_sent, ttl = self.kept_alive
        self.valid_until = max(self.valid_until or 0.0, kept_sent + ttl - self.timing.margin)
        self.events.append(Renewed(self.epoch, self.valid_until))

    def _key_lost(self, body: dict) -> None:
        # deleted, overwritten or recreated: someone else may hold it already
        ranged = ((body.get("responses") or [{}])[0]).get("response_range") or {}
        kvs = ranged.get("kvs") or []
        self.holder_seen = _text(kvs[0].get("value", "")) if kvs else ""
        self._lose("key-lost")
        self.last_refusal = "key-lost"
        self._revoke_unused()

    def _revoke(self, body: dict, sent: float, now: float) -> None:
        pass

    def _revoke_unused(self) -> None:
        if self.lease_id is not None:
            self.pending.append(Request("revoke", "/v3/lease/revoke", {"ID": self.lease_id}))
            self.lease_id = None

    def _lose(self, reason: str) -> None:
        if self.valid_until is None:
            return
        self.valid_until = None
        self.pending.clear()  # a renewal's check, if any: the revoke must not wait behind it
        self.events.append(Lost(self.epoch, reason))

    # -- operator -------------------------------------------------------------------

    def release(self, now: float, reason: str) -> None:
        held = self.valid_until is not None
        self._lose(reason)
        if held:
            self._revoke_unused()

    def promote(self, now: float, *, force: bool = False) -> None:
        self.holdoff_until = 0.0
        self.next_at = now

    def demote(self, now: float) -> None:
        self.holdoff_until = now + 2 * self.granted_ttl + self.timing.renew
        self.release(now, "released")

    def set_maintenance(self, on: bool, now: float) -> None:
        self.maintenance = on
        if on:
            self.release(now, "maintenance")
        else:
            self.holdoff_until, self.next_at = 0.0, now

    def status(self, now: float) -> dict[str, Any]:
        return {
            "holding": self.holding(now),
            "epoch": self.epoch if self.holding(now) else None,
            "maintenance": self.maintenance,
            "holder_seen": self.holder_seen,
            "last_refusal": self.last_refusal,
            "key": self.key,
            "ttl": self.granted_ttl or self.ttl,
            "errors": self.errors,
        }


def _text(value: str) -> str:
    try:
        return base64.b64decode(value).decode(errors="replace")[:64]
    except ValueError:
        return "?"
