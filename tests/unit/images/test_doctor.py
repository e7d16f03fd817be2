"""`rackboot doctor`'s images check: a verdict on the images part of the node's status."""

from __future__ import annotations

from appliance.doctor.findings import Verdict
from plugins.images.doctor import judge_images

HEALTHY = {"versions": 3, "images": {"debian": "12.5", "alpine": "3.20"}, "missing": [],
           "refused": [], "sync": {"failing": {}}}  # fmt: skip


def test_complete_images_pass():
    finding = judge_images(HEALTHY)
    assert finding.verdict is Verdict.PASS and finding.summary == "3 versions complete, 2 images"


def test_a_version_syncing_warns_and_one_that_cannot_be_fetched_fails():
    syncing = {**HEALTHY, "missing": ["debian@12.6"]}
    assert judge_images(syncing).verdict is Verdict.WARN
    stuck = {**syncing, "sync": {"failing": {"debian@12.6": "no peer has chunk 3f2a"}}}
    finding = judge_images(stuck)
    assert finding.verdict is Verdict.FAIL and "debian@12.6" in finding.summary
    assert finding.details == ("missing: debian@12.6 (fetch failing: no peer has chunk 3f2a)",)


def test_a_refused_version_fails_and_no_store_skips():
    refused = {**HEALTHY, "refused": ["heads/debian/12.5: bad signature"]}
    finding = judge_images(refused)
    assert finding.verdict is Verdict.FAIL and "image verify" in finding.action
    assert judge_images({}).verdict is Verdict.SKIP
