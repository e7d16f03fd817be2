"""A lab's record: locked from before it exists until it is released, so a record left
by a lab that died is told from a running one's (appliance/lab/leftovers.py). Files
under tmp_path only: no root, no namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from appliance.lab import leftovers


def test_a_claimed_record_is_running_and_a_released_one_is_gone(tmp_path: Path) -> None:
    claim = leftovers.claim("00000a", {"workdir": "/tmp/x"}, registry=tmp_path)
    assert leftovers.records(tmp_path) == {"00000a": True}
    info = json.loads((tmp_path / "00000a.lock").read_text())
    assert info == {"workdir": "/tmp/x", "pid": os.getpid()}
    assert [p.name for p in tmp_path.iterdir()] == ["00000a.lock"]  # no temporary name left
    claim.release()
    assert leftovers.records(tmp_path) == {}


def test_the_record_of_a_lab_that_died_is_stale(tmp_path: Path) -> None:
    # A child process claims and dies without releasing: the kernel drops its lock.
    code = (
        "import sys; from pathlib import Path; from appliance.lab import leftovers; "
        "leftovers.claim('00000b', {}, registry=Path(sys.argv[1])); "
        "import os; os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=30)
    assert leftovers.records(tmp_path) == {"00000b": False}
    running = leftovers.claim("00000c", {}, registry=tmp_path)
    assert leftovers.records(tmp_path) == {"00000b": False, "00000c": True}
    running.release()


def test_no_registry_no_records(tmp_path: Path) -> None:
    assert leftovers.records(tmp_path / "absent") == {}
