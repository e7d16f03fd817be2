"""``rackboot doctor``'s images check: is every version the rack committed complete here,
verified, and served (sans-IO: a verdict on the images part of the node's status)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.doctor.findings import (
    DoctorCheck,
    DoctorContext,
    Finding,
    count,
    failed,
    passed,
    skipped,
)
from appliance.doctor.findings import warned as warned_

CHECK = "images"


def judge_images(images: Mapping[str, Any]) -> Finding:
    if not images:
        return skipped(CHECK, "no image store on this node ([images] enabled = false)")
    missing = list(images.get("missing", []))
    refused = list(images.get("refused", []))
    failing: Mapping[str, str] = images.get("sync", {}).get("failing", {})
    details = tuple(
        [f"refused: {line}" for line in refused]
        + [f"missing: {key}" + (f" (fetch failing: {failing[key]})" if key in failing else "")
           for key in missing]
    )  # fmt: skip
    data = {"missing": missing, "refused": refused, "failing": dict(failing)}
    if refused:
        return failed(
            CHECK, f"{count(len(refused), 'stored version')} refused at load (damaged or badly signed)",
            "a refused version is not served: machines booting it fail",
            "`rackboot image verify NAME --version V`; remove the version (`image rm`) so the "
            "store fetches it again from a peer", details=details, data=data,
        )  # fmt: skip
    stuck = [key for key in missing if key in failing]
    if stuck:
        return failed(
            CHECK, f"{count(len(stuck), 'version')} the rack committed cannot be fetched here: "
            + ", ".join(stuck),
            "this appliance cannot serve them: after a failover, machines booting them fail",
            "check the peers' HTTP boot ports ([httpboot]) from here; the error is in details",
            details=details, data=data,
        )  # fmt: skip
    if missing:
        return warned_(
            CHECK, f"syncing {count(len(missing), 'version')}: " + ", ".join(missing),
            "until they are complete this appliance cannot serve them",
            "wait for the sync (`rackboot image list` shows progress); run the doctor again",
            details=details, data=data,
        )  # fmt: skip
    versions = images.get("versions", 0)
    return passed(CHECK, f"{count(versions, 'version')} complete, {count(len(images.get('images', {})), 'image')}",
                  data=data)  # fmt: skip


def run(ctx: DoctorContext) -> list[Finding]:
    return [judge_images(ctx.section("images"))]


CHECKS = [DoctorCheck(CHECK, run)]
