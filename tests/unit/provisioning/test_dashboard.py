"""The Grafana dashboard in docs/ names only metrics the provisioning plugin exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from plugins.provisioning.plugin import Metrics

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana" / "provisioning.json"


def exported() -> set[str]:
    """Every series name the plugin's metrics produce (counters' _total, histograms'
    _bucket/_sum/_count...), as a scrape shows them."""
    registry = CollectorRegistry()
    Metrics(registry)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {family.name + suffix for family in registry.collect()
            for suffix in suffixes.get(family.type, ("",))}  # fmt: skip


def test_every_query_names_an_exported_metric_and_every_panel_is_described():
    dashboard = json.loads(DASHBOARD.read_text())
    names = exported()
    queried = set()
    for panel in dashboard["panels"]:
        assert panel.get("description"), f"panel {panel['title']!r} has no description"
        for target in panel["targets"]:
            found = set(re.findall(r"\brackboot_[a-z0-9_]+", target["expr"]))
            assert found, f"{panel['title']!r}: a query naming no Rackboot metric"
            assert found <= names, f"{panel['title']!r}: {sorted(found - names)} not exported"
            queried |= found
    # the dashboard shows each of the plugin's metrics somewhere
    families = {n.removesuffix("_total").removesuffix("_bucket") for n in queried}
    assert {"rackboot_provisioning_attempts", "rackboot_provisioning_successes",
            "rackboot_provisioning_failures", "rackboot_provisioning_spares_used",
            "rackboot_provisioning_seconds"} <= families  # fmt: skip


def test_the_check_catches_a_metric_the_code_does_not_export():
    assert "rackboot_provisioning_attempts_total" in exported()
    assert "rackboot_provisioning_attempt_total" not in exported()  # a typo would fail above
