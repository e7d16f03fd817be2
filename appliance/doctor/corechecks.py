"""The core's doctor checks, as the core plugin contributes them (``rackboot_doctor_checks``):
each gathers its facts (the node's status, /proc, adjtimex) and hands them to a pure
verdict of :mod:`~appliance.doctor.nodechecks`, :mod:`~appliance.doctor.sockets`,
:mod:`~appliance.doctor.timechecks` or :mod:`~appliance.doctor.rackchecks`."""

from __future__ import annotations

import os

from appliance.doctor import observe
from appliance.doctor.findings import DoctorCheck, DoctorContext, Finding
from appliance.doctor.nodechecks import judge_node, judge_services
from appliance.doctor.rackchecks import (
    Rack,
    judge_lease,
    judge_links,
    judge_log,
    judge_members,
    judge_replication,
)
from appliance.doctor.sockets import judge_ports
from appliance.doctor.timechecks import judge_clock, judge_skew, skew_samples
from appliance.ha.schema import parse_member


def rack_of(ctx: DoctorContext) -> Rack:
    ha = ctx.config["ha"]
    return Rack(
        peers=dict(map(parse_member, ha.peers)),
        witnesses=dict(map(parse_member, ha.witnesses)),
        lease=ha.lease,
        port=ha.port,
    )


def _names(ctx: DoctorContext) -> dict[str, str]:
    site = ctx.section("core").get("cluster", {}).get("site", [])
    return {row["node_id"]: row.get("name") or row["node_id"] for row in site if row.get("node_id")}


def node(ctx: DoctorContext) -> list[Finding]:
    return [judge_node(ctx.status, ctx.unreachable)]


def services(ctx: DoctorContext) -> list[Finding]:
    return [judge_services(ctx.status or {})]


def ports(ctx: DoctorContext) -> list[Finding]:
    core = ctx.section("core")
    pid = core.get("pid")
    if isinstance(pid, int) and os.path.isdir(f"/proc/{pid}"):
        sockets, inodes, why = observe.node_sockets(pid)
    else:  # another host's node, or another pid namespace's
        sockets, inodes, why = None, frozenset[int](), f"the node's pid {pid} is not visible here"
    listeners = core.get("listeners", [])
    declared = {(entry.get("protocol"), entry.get("port")) for entry in listeners}
    # whose are the other sockets on a declared port (a scan of /proc: only when some exist)
    foreign = {s.inode for s in sockets or ()
               if s.inode not in inodes and (s.protocol, s.port) in declared}  # fmt: skip
    return [judge_ports(listeners, sockets, inodes, observe.holders(foreign), why)]


def clock(ctx: DoctorContext) -> list[Finding]:
    return [judge_clock(ctx.wall, observe.clock_sync())]


def skew(ctx: DoctorContext) -> list[Finding]:
    rack = rack_of(ctx)
    samples = skew_samples(ctx.section("core"))
    return [judge_skew(samples, bool(rack.peers), ctx.config["ha"].max_clock_skew)]


def links(ctx: DoctorContext) -> list[Finding]:
    return [judge_links(ctx.section("core"), rack_of(ctx))]


def members(ctx: DoctorContext) -> list[Finding]:
    rack, core = rack_of(ctx), ctx.section("core")
    return [judge_members(core, rack, "peers"), judge_members(core, rack, "witnesses")]


def lease(ctx: DoctorContext) -> list[Finding]:
    return [judge_lease(ctx.section("core"), _names(ctx))]


def state(ctx: DoctorContext) -> list[Finding]:
    core = ctx.section("core")
    return [judge_log(core), judge_replication(core, rack_of(ctx), _names(ctx))]


CHECKS = [
    DoctorCheck("node", node, needs_node=False),
    DoctorCheck("services", services),
    DoctorCheck("ports", ports),
    DoctorCheck("time.clock", clock, needs_node=False),
    DoctorCheck("time.skew", skew),
    DoctorCheck("cluster.links", links),
    DoctorCheck("ha.members", members),
    DoctorCheck("ha.lease", lease),
    DoctorCheck("state", state),
]
