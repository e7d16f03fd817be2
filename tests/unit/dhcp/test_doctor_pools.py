"""`rackboot doctor`'s DHCP pool check: a verdict on the dhcp part of the node's status."""

from __future__ import annotations

from appliance.doctor.findings import Verdict
from plugins.dhcp.doctor import judge_pools


def pools(**usage: tuple[int, int]) -> dict:
    return {"serving": True,
            "pools": {key: {"active": a, "size": s} for key, (a, s) in usage.items()}}  # fmt: skip


def test_pool_fill():
    assert judge_pools(pools(lan=(10, 100))).verdict is Verdict.PASS
    high = judge_pools(pools(lan=(10, 100), pxe=(91, 100)))
    assert high.verdict is Verdict.WARN and high.summary.endswith("leased: pxe")
    full = judge_pools(pools(lan=(100, 100), pxe=(91, 100)))
    assert full.verdict is Verdict.FAIL and full.summary == "pools full: lan"
    assert judge_pools(pools(empty=(0, 0))).verdict is Verdict.PASS  # a zero-size pool: no share
    assert judge_pools({"serving": False}).verdict is Verdict.SKIP
