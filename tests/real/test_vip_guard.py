"""The VIP guard process in a namespace: it removes a leftover address, holds the address
until the deadline it was given and not a moment longer, ignores SIGTERM, and drops the
address at once when its node's end of the pipe closes (the node died)."""

from __future__ import annotations

import selectors
import signal
import subprocess
import sys
import time

import pytest

from appliance.clock import boottime
from appliance.ha import vipguard
from tests.support.netns import Host, Lab


@pytest.fixture
def host(lab: Lab) -> Host:
    return lab.add_host("g")


def vip_of(host: Host) -> str:
    return f"{host.network.network_address + 200}/{host.network.prefixlen}"


def addresses(host: Host) -> str:
    return host.run(["ip", "-4", "-o", "addr", "show", "dev", host.ifname], check=True).stdout


def start_guard(host: Host) -> subprocess.Popen:
    return host.popen(
        [sys.executable, "-I", "-S", vipguard.__file__, host.ifname, vip_of(host)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def next_line(proc: subprocess.Popen, timeout: float) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            pytest.fail(f"the guard said nothing within {timeout} s")
    return proc.stdout.readline().decode().strip()


def tell(proc: subprocess.Popen, line: str) -> None:
    proc.stdin.write(line.encode() + b"\n")
    proc.stdin.flush()


def test_a_leftover_vip_is_removed_when_the_guard_starts(host):
    host.run(["ip", "addr", "add", vip_of(host), "dev", host.ifname], check=True)
    proc = start_guard(host)
    assert next_line(proc, 5) == "dropped"
    assert vip_of(host) not in addresses(host)
    proc.stdin.close()
    assert proc.wait(5) == 0


def test_the_vip_is_held_until_the_deadline_and_no_longer(host):
    proc = start_guard(host)
    assert next_line(proc, 5) == "dropped"  # the start-up removal of an absent address
    deadline = boottime() + 1.2
    tell(proc, f"hold {deadline:.6f}")
    assert next_line(proc, 2) == "held"
    shown = addresses(host)
    assert vip_of(host) in shown and "valid_lft 2sec" in shown  # the kernel's last resort
    lines = [next_line(proc, 2)]
    while lines[-1] == "held":
        lines.append(next_line(proc, 2))
    assert lines[-1] == "dropped" and len(lines) >= 2, lines  # refreshed, then removed
    late = boottime() - deadline
    assert vip_of(host) not in addresses(host)
    assert -0.001 < late < 0.1, f"removed {late * 1000:.1f} ms after the deadline"
    proc.stdin.close()
    assert proc.wait(5) == 0


def test_sigterm_is_ignored_and_the_nodes_death_drops_the_vip_at_once(host):
    proc = start_guard(host)
    assert next_line(proc, 5) == "dropped"
    tell(proc, f"hold {boottime() + 30:.6f}")
    assert next_line(proc, 2) == "held"
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    assert proc.poll() is None and vip_of(host) in addresses(host)
    closed = time.monotonic()
    proc.stdin.close()  # what the kernel does when the node is killed
    assert next_line(proc, 2) == "dropped"
    assert time.monotonic() - closed < 0.1
    assert vip_of(host) not in addresses(host)
    assert proc.wait(5) == 0
