"""The dhcp plugin's ``rackboot doctor`` checks: the pools' fill, and with
``--dhcp-probe IFACE`` the rogue-server probe (plugins/dhcp/probe.py, probenet.py).

What counts as this rack's server: the VIP and [ha] peers of the configuration,
``[dhcp] server_address``, the identifiers the node's DHCP server knows for the
rack's appliances (its own and the announced ones), the addresses of this rack's
appliances on the cluster links, and ``--known-server``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from appliance.doctor.findings import (
    DoctorCheck,
    DoctorContext,
    DoctorOptions,
    Finding,
    count,
    failed,
    passed,
    skipped,
    warned,
)
from appliance.ha.schema import parse_member

from .probe import CHECK as PROBE
from .probe import judge_probe, known_address

POOL_WARN = 0.9  # a pool this full leaves little room for a rack's reinstall wave


def known_servers(ctx: DoctorContext) -> dict[str, str]:
    known: dict[str, str] = {}

    def add(text: Any, what: str) -> None:
        address = known_address(str(text)) if text else None
        if address is not None:
            known.setdefault(address, what)

    ha = ctx.config["ha"]
    add(ha.vip, "this rack's VIP")
    for member in ha.peers:
        node_id, address = parse_member(member)
        add(address, f"appliance {node_id}")
    add(ctx.config["dhcp"].server_address, "[dhcp] server_address")
    for address in ctx.section("dhcp").get("server_identifiers", []):
        add(address, "this rack's appliance")
    core = ctx.section("core")
    for row in core.get("cluster", {}).get("site", []):
        if row.get("rack") == core.get("rack") and row.get("address"):
            add(row["address"], f"appliance {row.get('name') or row.get('node_id')}")
    for address in ctx.options.known_servers:
        add(address, "--known-server")
    return known


def _serving_here(ctx: DoctorContext, interface: str) -> bool:
    """Is the probe on an interface the node serves, from the node's own namespace?"""
    pid = ctx.section("core").get("pid")
    if interface not in ctx.section("dhcp").get("interfaces", []) or not isinstance(pid, int):
        return False
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return False


def probe(ctx: DoctorContext) -> list[Finding]:
    from .probenet import ProbeError, run_probe

    interface, timeout = ctx.options.dhcp_probe, ctx.options.timeout
    try:
        collector = run_probe(interface, timeout)
    except ProbeError as exc:
        return [failed(PROBE, f"no probe on {interface}: {exc}",
                       "without it a foreign DHCP server on the link goes unseen",
                       "run `rackboot doctor --dhcp-probe IFACE` as root, on a host of the link")]  # fmt: skip
    return [judge_probe(interface, collector.answers, known_servers(ctx), timeout=timeout,
                        serving_here=_serving_here(ctx, interface), counts=collector.counts())]  # fmt: skip


def judge_pools(dhcp: Mapping[str, Any]) -> Finding:
    if not dhcp.get("serving"):
        return skipped("dhcp.pools", "DHCP does not serve on this node")
    pools: Mapping[str, Mapping[str, int]] = dhcp.get("pools", {})
    fill = {key: p.get("active", 0) / p["size"] for key, p in pools.items() if p.get("size")}
    details = tuple(f"{key}: {pools[key].get('active')} of {pools[key].get('size')} leased"
                    for key in sorted(pools))  # fmt: skip
    # (verdict, share from which, what it is, why it matters); the worst first
    levels = (
        (failed, 1.0, "pools full", "a new machine on those subnets gets no address"),
        (warned, POOL_WARN, f"pools over {POOL_WARN:.0%} leased",
         "a wave of new or reinstalled machines may exhaust them"),
    )  # fmt: skip
    for verdict, share, what, why in levels:
        over = sorted(key for key, used in fill.items() if used >= share)
        if over:
            return verdict(
                "dhcp.pools", f"{what}: {', '.join(over)}", why,
                "widen the pool in [[dhcp.subnets]] pools, or shorten lease_time",
                details=details,
            )  # fmt: skip
    return passed("dhcp.pools", f"{count(len(pools), 'pool')}, none over {POOL_WARN:.0%} leased",
                  details=details)  # fmt: skip


def pools(ctx: DoctorContext) -> list[Finding]:
    return [judge_pools(ctx.section("dhcp"))]


def checks(options: DoctorOptions) -> list[DoctorCheck]:
    found = [DoctorCheck("dhcp.pools", pools)]
    if options.dhcp_probe:
        found.append(DoctorCheck(PROBE, probe, needs_node=False, option="dhcp_probe"))
    return found
