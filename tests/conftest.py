"""Shared test configuration: hypothesis profiles and the layer markers.

Layers (see docs/architecture.md): ``tests/unit`` pure sans-IO tests with
explicit time; ``tests/trio`` trio tests on the autojump clock and the
in-memory network; ``tests/real`` network namespaces and real third-party
programs (root only); ``tests/simulation`` seeded whole-cluster simulations.

``RACKBOOT_TEST_PROFILE=long`` selects the long hypothesis profile (fuzzing
with >= 100,000 examples); the default ``ci`` profile keeps CI quick.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=100_000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("RACKBOOT_TEST_PROFILE", "ci"))
