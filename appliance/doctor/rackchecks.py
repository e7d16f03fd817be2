"""The rack around the node: its links, its election's members, the lease, the state log
and its replication (sans-IO: each judges the node's status and the [ha] settings).

A member of the election is *heard* when its last datagram passed the
certificate and signature checks (``ha.transport.heard``): reachable and
authenticated at once. Every acceptor answers every round (the active renews
every ``renew``; a standby keeps asking and is told ``busy``), so a member
silent for several lease periods is cut off, stopped, or no longer trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from appliance.doctor.findings import Finding, count, failed, passed, skipped, warned

STALE_LEASES = 5.0  # a member silent this many lease periods (at least MIN_STALE s) is lost
MIN_STALE = 3.0
LAG_WARN = 1000  # records a standby may trail by before the doctor says so


@dataclass(frozen=True)
class Rack:
    """What the doctor knows of the rack from [ha]: node id -> "host:port"."""

    peers: Mapping[str, str]
    witnesses: Mapping[str, str]
    lease: float = 1.0
    port: int = 7471


def judge_links(core: Mapping[str, Any], rack: Rack) -> Finding:
    """The cluster's peer links (TLS, both ends' certificates checked): who is up, who
    refuses, who is gone."""
    cluster = core.get("cluster", {})
    if cluster.get("state") != "member":
        return skipped("cluster.links", f"not a cluster member ({cluster.get('state', 'off')})")
    own_rack = core.get("rack")
    rows = [row for row in cluster.get("site", []) if not row.get("self")]
    details = tuple(
        f"{row.get('name') or row.get('node_id')} (rack {row.get('rack') or '?'}): "
        f"{row.get('state')}{': ' + row['reason'] if row.get('reason') else ''}"
        for row in rows
    )
    refused = [row for row in rows if row.get("state") == "refused"]
    down = [row for row in rows if row.get("state") != "up" and row not in refused]
    here = [row for row in down if row.get("rack") == own_rack or row.get("node_id") in rack.peers]
    name = lambda row: str(row.get("name") or row.get("node_id") or row.get("address"))  # noqa: E731
    if refused:
        return failed(
            "cluster.links", "refused: " + "; ".join(f"{name(r)}: {r.get('reason')}" for r in refused),
            "the two ends do not trust each other's certificate (another cluster, a revoked or "
            "re-enrolled member) or speak no common version",
            "check the member with `rackboot cluster` (re-join it with a fresh token, or "
            "`cluster remove` it); update both to compatible versions", details=details,
        )  # fmt: skip
    if here:
        return failed(
            "cluster.links", "this rack's appliance offline: " + ", ".join(map(name, here)),
            "the rack may be one failure away from no standby",
            "check that `rackboot run` runs there and the TCP path to its [cluster] port",
            details=details,
        )  # fmt: skip
    if down:
        return warned(
            "cluster.links", "offline: " + ", ".join(map(name, down)),
            "an appliance of another rack is not linked", "check it from its own rack",
            details=details,
        )  # fmt: skip
    if not rows and rack.peers:
        return warned(
            "cluster.links", "no cluster link to this rack's peers",
            "without links, `rackboot status` does not show them and this node cannot "
            "measure its clock skew to them",
            "[cluster] mdns = true, or list them in [cluster] peers", details=details,
        )  # fmt: skip
    return passed("cluster.links", f"{count(len(rows), 'peer')} linked (TLS, authenticated)",
                  details=details)  # fmt: skip


def _stale_after(rack: Rack) -> float:
    return max(MIN_STALE, STALE_LEASES * rack.lease)


def judge_members(core: Mapping[str, Any], rack: Rack, kind: str) -> Finding:
    """``kind`` "peers" (the rack's other appliances) or "witnesses": each heard lately?"""
    check = f"ha.{kind}"
    members = rack.peers if kind == "peers" else rack.witnesses
    ha = core.get("ha", {})
    if ha.get("mode") != "embedded":
        return skipped(check, f"no embedded election ({ha.get('mode', 'standalone')})")
    if not members:
        return skipped(check, f"no [ha] {kind}")
    heard: Mapping[str, float] = ha.get("transport", {}).get("heard", {})
    limit = _stale_after(rack)
    lines, lost = [], []
    for node_id, address in sorted(members.items()):
        ago = heard.get(node_id)
        if ago is None or ago > limit:
            lost.append(f"{node_id}@{address}")
        lines.append(
            f"{node_id}@{address}: " + ("never heard" if ago is None else f"heard {ago:.1f} s ago")
        )
    data = {
        "heard": dict(heard),
        "stale_after": limit,
        "dropped": ha.get("transport", {}).get("dropped", {}),
    }
    if not lost:
        return passed(check, f"{count(len(members), kind[:-1] if kind == 'peers' else 'witness', kind)} heard "
                      f"(signed datagrams, within {limit:g} s)",
                      details=tuple(lines), data=data)  # fmt: skip
    reason = (
        "without its standby the rack has no failover"
        if kind == "peers"
        else "the rack's majority then needs every appliance: one more failure and no "
        "appliance may hold the lease"
    )
    run_there = "`rackboot run`" if kind == "peers" else "`rackboot witness`"
    return failed(
        check, f"not heard for {limit:g} s: {', '.join(lost)}",
        f"{reason} (or its datagrams fail the certificate check: see transport.dropped)",
        f"check that {run_there} runs there and UDP port {rack.port} between them; "
        "`rackboot ha status --json` on both shows what each drops",
        details=tuple(lines), data=data,
    )  # fmt: skip


def judge_lease(core: Mapping[str, Any], names: Mapping[str, str]) -> Finding:
    """Who holds the rack's lease, and can this node take it when it must?"""
    ha = core.get("ha", {})
    mode = ha.get("mode", "standalone")
    if mode == "standalone":
        return passed("ha.lease", "standalone: this node is always active")
    election = ha.get("election", {})
    vip = ha.get("vip") or {}
    blocked = election.get("blocked") or election.get("membership", {}).get("blocked", "")
    if blocked == "mismatch":
        return failed(
            "ha.lease", "the rack's appliances disagree on [ha] peers and witnesses",
            "an appliance whose membership differs from the others' never takes the lease",
            "list the same members in [ha] on every appliance of the rack (each its "
            "others), then restart them one at a time",
        )  # fmt: skip
    if ha.get("role") == "active":
        if vip and not vip.get("held"):
            return failed(
                "ha.lease", f"active without the VIP {vip.get('address')}",
                "clients are told to come back to the VIP: nothing answers there",
                "read the node's log (VIP guard errors); check [ha] vip_interface",
            )  # fmt: skip
        held = f", VIP {vip.get('address')}" if vip else ""
        return passed(
            "ha.lease", f"active: holds the rack's lease (epoch {ha.get('epoch')}, "
            f"valid for {ha.get('valid_for')} s{held})",
        )  # fmt: skip
    if election.get("maintenance"):
        return warned(
            "ha.lease", "maintenance on: this node will not take the lease",
            "if the active fails, this node does not take over",
            "`rackboot ha maintenance off` when the work is done",
        )  # fmt: skip
    holder = election.get("holder_seen") or ""
    if mode == "embedded" and not holder:
        return failed(
            "ha.lease", "standby, and no appliance is seen holding the lease",
            "nobody answers dynamic DHCP for the rack",
            "check the other appliances and the witnesses (`rackboot ha status` there)",
        )  # fmt: skip
    held_by = f": {names.get(holder, holder)} holds the lease" if holder else ""
    return passed("ha.lease", f"standby{held_by}")


def judge_replication(core: Mapping[str, Any], rack: Rack, names: Mapping[str, str]) -> Finding:
    replication = core.get("state", {}).get("replication")
    if not rack.peers or replication is None:
        return skipped("state.replication", "no replication (no [ha] peers)")
    name = lambda node_id: names.get(node_id, node_id)  # noqa: E731
    if core.get("role") != "active":
        following = replication.get("following") or {}
        if following.get("stage") == "stream":
            return passed("state.replication", f"following {name(following.get('leader'))}'s log")
        return warned(
            "state.replication", "not following the active's log"
            + (f" (stage {following['stage']})" if following.get("stage") else ""),
            "a standby that has not caught up may not take over",
            "wait a few seconds; if it stays so, check the TCP path to the active's "
            "[ha] port + 1 and the node's log", data=dict(replication),
        )  # fmt: skip
    followers = replication.get("followers", {})
    lines = tuple(
        f"{name(node_id)}: {f.get('stage')}, lag {f.get('lag')}"
        + ("" if f.get("counted") else ", NOT COUNTED (declared ineligible)")
        for node_id, f in sorted(followers.items())
    )
    missing = [name(p) for p in sorted(rack.peers) if p not in followers]
    uncounted = [name(p) for p, f in sorted(followers.items()) if not f.get("counted")]
    if missing or uncounted:
        what = ([f"not connected: {', '.join(missing)}"] if missing else []) + (
            [f"declared ineligible: {', '.join(uncounted)}"] if uncounted else []
        )
        return failed(
            "state.replication", "; ".join(what),
            "a standby without this node's latest records is not allowed to take over",
            "check it is running and reaches this node's [ha] port + 1 (TCP); once it "
            "has caught up it is counted again", details=lines, data=dict(replication),
        )  # fmt: skip
    behind = [name(p) for p, f in sorted(followers.items())
              if f.get("stage") != "stream" or (f.get("lag") or 0) > LAG_WARN]  # fmt: skip
    if behind:
        return warned(
            "state.replication", f"catching up: {', '.join(behind)}",
            "a standby that trails may have to be waited for at a failover",
            "wait; if the lag keeps growing, check the standby's disk and link",
            details=lines, data=dict(replication),
        )  # fmt: skip
    return passed("state.replication", f"{count(len(followers), 'standby', 'standbys')} streaming, caught up",
                  details=lines)  # fmt: skip


def judge_log(core: Mapping[str, Any]) -> Finding:
    state = core.get("state", {})
    if not state:
        return skipped("state.log", "no state log in status")
    trouble = [
        what for what, bad in (
            (f"problem: {state.get('problem')}", state.get("problem")),
            ("damaged records found", state.get("damage")),
            ("a resync from the active is needed", state.get("resync_needed")),
            (f"{state.get('write_failures')} write failures", state.get("write_failures")),
        ) if bad
    ]  # fmt: skip
    if trouble:
        return failed(
            "state.log", "; ".join(trouble),
            "leases and records this appliance must not forget live in this log",
            "read docs/state.md (damage and recovery) and the node's log; check the disk",
        )  # fmt: skip
    return passed(
        "state.log", f"{state.get('keys', 0)} keys, lsn {state.get('lsn')}, "
        f"{state.get('uncommitted', 0)} uncommitted",
    )  # fmt: skip
