"""The real layer: network namespaces and real programs. Skips, never fails, where it cannot run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.netns import Lab, need_root, probe_netns

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items: mark only ours.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.real)


@pytest.fixture(scope="session")
def netns_available() -> None:
    """Skip unless we are root and may create network namespaces (probed once per session)."""
    reason = need_root() or probe_netns()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def lab(netns_available: None) -> Iterator[Lab]:
    with Lab() as lab:
        yield lab
