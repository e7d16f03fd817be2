"""``rackboot lab`` as an operator runs it: a subprocess, as root, building its rack in
network namespaces (docs/lab.md).

* ``--once``: the VM boots from the active, the active is killed, the VM boots again
  from the standby, exit 0; nothing of the lab is left afterwards (namespaces, its
  record, any process of its work directory); a stale lab planted beforehand (an
  unlocked record, a namespace with a process in it) was removed first, and a running
  one (its record locked) left alone;
* a namespace with the lab's prefix that no record owns: refused (exit 8), untouched;
* Ctrl-C (SIGINT) during the first boot: the lab tears everything down, exit 130.

The VM's kernel is cached with the netboot test's (pytest's cache, rackboot-netboot).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.lab import census, leftovers, packages
from appliance.lab.netns import new_id
from tests.support.dhcplab import read_line, stop_process

LAB_TIMEOUT = 600.0  # the whole --once run: 17-18 s measured under TCG (two boots)
STARTED = re.compile(r"lab rblab([0-9a-f]{6}): files and logs in")


@pytest.fixture(scope="module")
def cache(netns_available: None, request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Path:  # fmt: skip
    lacking = packages.missing()
    if lacking:
        pytest.skip("rackboot lab needs " + ", ".join(f"{n.what} ({n.package})" for n in lacking))
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("/dev/net/tun is missing (no tap for the VM)")
    cached = getattr(request.config, "cache", None)  # the unpacked kernel, kept across runs
    return cached.mkdir("rackboot-netboot") if cached else tmp_path_factory.mktemp("debs")


def lab_argv(work: Path, cache: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "appliance", "lab", "--no-install", "--workdir", str(work),
            "--cache", str(cache), *more]  # fmt: skip


def assert_nothing_left(lab_id: str, work: Path) -> None:
    assert census.by_lab(leftovers.namespaces()).get(lab_id) is None
    assert lab_id not in leftovers.records()
    assert processes_of(work) == []


def processes_of(work: Path) -> list[str]:
    """Every process whose command line names the work directory (nodes, witness, QEMU)."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(work) in cmdline:
            found.append(f"{pid}: {cmdline[:200]}")
    return found


@pytest.fixture
def stale_lab(netns_available: None) -> Iterator[tuple[str, str, subprocess.Popen]]:
    """What a lab killed with SIGKILL leaves: its unlocked record, a namespace with a
    process in it. Removed here (by PID, by name) if the lab under test did not."""
    lab_id = new_id()
    ns = f"{census.PREFIX}{lab_id}-x"
    leftovers.REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
    record = leftovers.REGISTRY / f"{lab_id}.lock"
    record.write_text(json.dumps({"pid": 0, "workdir": "", "remove_workdir": False}))
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "600"],
                               start_new_session=True)  # fmt: skip
    try:
        yield lab_id, ns, sleeper
    finally:
        stop_process(sleeper, signal.SIGKILL, 5)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        record.unlink(missing_ok=True)


@pytest.fixture
def running_lab(netns_available: None) -> Iterator[tuple[str, str]]:
    """Another lab that runs: its record locked (by this process), one namespace."""
    lab_id = new_id()
    ns = f"{census.PREFIX}{lab_id}-x"
    claim = leftovers.claim(lab_id, {"workdir": "", "remove_workdir": False})
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
        yield lab_id, ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        claim.release()


def test_once_boots_twice_across_a_failover_and_leaves_nothing(
    cache: Path,
    tmp_path: Path,
    stale_lab: tuple[str, str, subprocess.Popen],
    running_lab: tuple[str, str],
) -> None:
    stale_id, stale_ns, sleeper = stale_lab
    work = tmp_path / "lab"
    res = subprocess.run(lab_argv(work, cache, "--once"), capture_output=True, text=True,
                         timeout=LAB_TIMEOUT)  # fmt: skip
    out = res.stdout
    print("\n".join(line for line in out.splitlines() if line.startswith("[")))
    assert res.returncode == 0, f"{out[-6000:]}\n{res.stderr[-3000:]}"
    # The stale lab went first: its process ended by PID, its namespace and record removed.
    assert f"removed the stale lab {stale_id}" in out
    assert sleeper.wait(timeout=10) is not None
    assert not os.path.exists(f"/run/netns/{stale_ns}")
    assert stale_id not in leftovers.records()
    # The lab that runs beside it was left alone.
    assert os.path.exists(f"/run/netns/{running_lab[1]}")
    assert leftovers.records()[running_lab[0]] is True
    # The story, as the lab tells it, and as the appliances' logs tell it.
    (first,) = re.findall(r"boot 1: installed [\d.]+ s after the request, served by (\w)", out)
    killed, active = re.findall(r"failover [\d.]+ s \((\w) killed, (\w) active", out)[0]
    (second,) = re.findall(r"boot 2: installed [\d.]+ s after the request, served by (\w)", out)
    assert first == killed and second == active != killed
    events = (work / "rack" / active / "node.log").read_text()
    assert re.search(r'msg="machine event" mac=52:54:00:6c:61:62 seq=2 stage=installed', events)
    assert "PASS:" in out
    (lab_id,) = STARTED.findall(out)
    assert f"torn down: nothing of lab rblab{lab_id} is left" in out
    assert_nothing_left(lab_id, work)


def test_namespaces_with_the_labs_prefix_and_no_record_are_refused(
    cache: Path, tmp_path: Path
) -> None:
    ns = f"{census.PREFIX}{new_id()}-x"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
    try:
        res = subprocess.run(lab_argv(tmp_path / "lab", cache, "--once"), capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        assert res.returncode == 8, res.stdout + res.stderr
        assert ns in res.stderr and "ip netns del" in res.stderr
        assert os.path.exists(f"/run/netns/{ns}")  # not ours to remove
        assert STARTED.search(res.stdout) is None  # nothing built
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def test_ctrl_c_during_the_first_boot_tears_everything_down(cache: Path, tmp_path: Path) -> None:
    work = tmp_path / "lab"
    proc = subprocess.Popen(lab_argv(work, cache), stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.STDOUT)  # fmt: skip
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not any("boot 1: " in line for line in lines):
            line = read_line(proc, deadline - time.monotonic())
            assert line, "the lab ended before the first boot:\n" + "".join(lines)
            lines.append(line)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C at its terminal sends it
        rest, _ = proc.communicate(timeout=90)
    finally:
        stop_process(proc, signal.SIGKILL, 5)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-4000:]
    (lab_id,) = STARTED.findall(out)
    assert f"torn down: nothing of lab rblab{lab_id} is left" in out
    assert_nothing_left(lab_id, work)
