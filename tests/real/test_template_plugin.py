"""The template plugin of docs/examples/rackboot-rackinfo passes its own tests, installed
as a user installs it, against the Rackboot installed here.

The distribution is installed with pip into a throw-away ``--target`` directory; its
tests are copied away from the sources and run by pytest in a subprocess with that
directory on ``PYTHONPATH``. So the plugin is found through its entry point and the
fixtures through Rackboot's own pytest plugin (``pytest11`` entry point ``rackboot``),
as on a plugin author's machine. No root and no network needed: the node runs
in-process on loopback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.distributions import pip_install

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "docs" / "examples" / "rackboot-rackinfo"
PYTEST_TIMEOUT = 300.0


def test_the_template_passes_its_own_tests_once_installed(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pip_install(TEMPLATE, site, tmp_path / "work")
    assert list(site.glob("rackboot_rackinfo-0.1.0.dist-info"))
    tests = tmp_path / "project" / "tests"
    shutil.copytree(TEMPLATE / "tests", tests, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1",
           "XDG_DATA_HOME": str(tmp_path / "xdg")}  # fmt: skip
    env.pop("RACKBOOT_CONFIG", None)
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
        cwd=tests.parent, env=env, capture_output=True, text=True, timeout=PYTEST_TIMEOUT,
    )  # fmt: skip
    report = ran.stdout + ran.stderr
    assert ran.returncode == 0, report
    counts = dict(
        (word, int(n)) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", report)
    )
    assert counts.get("passed", 0) >= 20 and set(counts) == {"passed"}, report
