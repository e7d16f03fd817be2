"""The real layer: network namespaces and real programs. Skips, never fails, where it cannot run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ha_lab import Rack
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


def _rack(lab: Lab, tmp_path: Path, **kw) -> Iterator[Rack]:
    made = Rack(lab, tmp_path, **kw)
    try:
        yield made.start()
    finally:
        made.close()


@pytest.fixture
def rack(lab: Lab, tmp_path: Path) -> Iterator[Rack]:
    """Two appliances and a witness, started, one of them active (tests/support/ha_lab.py)."""
    yield from _rack(lab, tmp_path)


@pytest.fixture
def probed_rack(lab: Lab, tmp_path: Path) -> Iterator[Rack]:
    """A rack whose client host has an address, to ask ARP (or DHCP by unicast) from."""
    yield from _rack(lab, tmp_path, client_addr=True)
