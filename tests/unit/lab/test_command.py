"""`rackboot lab`'s refusals before it builds anything (no root needed to test them)."""

from __future__ import annotations

import pytest

from appliance.cli import main
from appliance.errors import EXIT_CONFIG, EXIT_LAB_UNAVAILABLE
from appliance.lab import run


def test_without_root_it_points_at_the_standalone_node(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run, "need_root", lambda: "needs root for network namespaces (euid 1000)")
    monkeypatch.setattr(run.leftovers, "survey", pytest.fail)  # never reached
    assert main(["lab", "--once"]) == EXIT_LAB_UNAVAILABLE
    err = capsys.readouterr().err
    assert err.startswith("rackboot: error: needs root for network namespaces (euid 1000)")
    assert "rackboot run" in err and err.count("\n") == 1


def test_a_boot_timeout_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "--boot-timeout", "5"]) == EXIT_CONFIG
    assert "--boot-timeout wants seconds from 10 to 3600, got 5" in capsys.readouterr().err
