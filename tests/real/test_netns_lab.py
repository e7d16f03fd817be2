"""The namespace lab itself, and a Rackboot node running inside it."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from appliance.lab import netns
from appliance.lab.netns import Host, Lab, LabError, have_commands, netns_exists


def ip_json(*args: str) -> list[dict[str, Any]]:
    res = subprocess.run(
        ["ip", "-j", *args], capture_output=True, text=True, timeout=10, check=True
    )
    return json.loads(res.stdout or "[]")


def ready_line(proc: subprocess.Popen, timeout: float = 10.0) -> str:
    """The child's first stdout line, waited for with a deadline (a blocking readline is not)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"pid {proc.pid} printed nothing within {timeout} s"
    return proc.stdout.readline().strip()


def test_hosts_reach_each_other_and_stay_out_of_the_root_namespace(lab: Lab) -> None:
    if not have_commands("ping"):
        pytest.skip("ping is not installed (apt-get install iputils-ping)")
    a, b = lab.add_host("a"), lab.add_host("b")
    assert a.network == b.network == lab.network and a.addr != b.addr
    for src, dst in ((a, b), (b, a)):
        res = src.run(["ping", "-c", "1", "-W", "2", dst.addr])
        assert res.returncode == 0, f"{src.name} -> {dst.addr}: {res.stdout}{res.stderr}"

    # The bridge and both its ports live in the bridge namespace...
    bridge_links = ip_json("-n", lab.bridge_ns, "link")
    ports = [link["ifname"] for link in bridge_links if link.get("master") == lab.bridge]
    assert len(ports) == 2
    lab_names = {lab.bridge, *ports, a.ifname, b.ifname}
    # ...and the root namespace sees none of the lab's interfaces or addresses.
    root_names = {link["ifname"] for link in ip_json("link")}
    assert not lab_names & root_names
    root_addrs = {i["local"] for link in ip_json("addr") for i in link.get("addr_info", [])}
    assert not {a.addr, b.addr} & root_addrs


def test_udp_crosses_the_bridge(lab: Lab) -> None:
    # Needs nothing but Python: runs even where ping is not installed.
    a, b = lab.add_host("a"), lab.add_host("b")
    server = (
        "import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "s.bind((sys.argv[1], 0)); print(s.getsockname()[1], flush=True); s.settimeout(10); "
        "data, peer = s.recvfrom(100); print(data.decode(), peer[0], flush=True)"
    )
    rx = b.popen([sys.executable, "-c", server, b.addr], stdout=subprocess.PIPE, text=True)
    port = ready_line(rx)
    client = (
        "import socket,sys; socket.socket(2, 2).sendto(b'hello', (sys.argv[1], int(sys.argv[2])))"
    )
    assert a.run([sys.executable, "-c", client, b.addr, port]).returncode == 0
    assert ready_line(rx) == f"hello {a.addr}"
    assert rx.wait(timeout=10) == 0


def test_close_stops_our_processes_and_deletes_namespaces(lab: Lab) -> None:
    a = lab.add_host("a")
    sleeper = a.popen(["sleep", "60"])
    stubborn = a.popen(
        [
            sys.executable,
            "-c",
            "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        text=True,
    )
    assert ready_line(stubborn) == "ready"  # SIGTERM is ignored from here on
    names = list(lab.namespaces)
    assert len(names) == 2 and all(netns_exists(ns) for ns in names)

    started = time.monotonic()
    lab.close(term_timeout=1.0, kill_timeout=5.0)
    assert time.monotonic() - started < 5.0
    assert sleeper.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert not any(os.path.exists(f"/proc/{p.pid}") for p in (sleeper, stubborn))
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    assert not any(ns in listed.stdout for ns in names)
    lab.close()  # idempotent: the fixture closes again


def test_add_host_failing_half_way_leaves_no_namespace(lab: Lab) -> None:
    lab.add_host("a")
    with pytest.raises(LabError, match="addr add"):
        lab.add_host("b", addr="10.1.2.300")  # namespace and veth exist when this fails
    assert "b" not in lab.hosts and not netns_exists(f"{lab.prefix}{lab.id}-b")
    assert lab.add_host("c").addr  # the lab stays usable
    names = list(lab.namespaces)
    lab.close()
    assert not any(netns_exists(ns) for ns in names)


class FailingIp:
    """Replaces netns._ip: the n-th call fails, before or after the real command ran."""

    def __init__(self, fail_at: int, after: bool) -> None:
        self.fail_at, self.after, self.calls = fail_at, after, 0
        self.armed = True  # only setup fails; teardown is tested separately
        self.namespaces: list[str] = []
        self.real = netns._ip

    def __call__(self, *args: str) -> None:
        self.calls += 1
        if args[:2] == ("netns", "add"):
            self.namespaces.append(args[2])
        failing = self.armed and self.calls == self.fail_at
        if failing and not self.after:
            raise LabError("injected")
        self.real(*args)
        if failing:
            raise LabError("injected")


@pytest.mark.parametrize("after", [False, True], ids=["before-command", "after-command"])
def test_setup_failing_at_any_step_leaves_nothing(
    netns_available: None, monkeypatch: pytest.MonkeyPatch, after: bool
) -> None:
    for fail_at in range(1, 60):  # bounded: a two-host lab takes 16 `ip` calls
        fake = FailingIp(fail_at, after)
        monkeypatch.setattr(netns, "_ip", fake)
        lab = None
        try:
            lab = Lab()
            lab.add_host("a")
            lab.add_host("b")
        except LabError as exc:
            assert "injected" in str(exc)
        else:
            break  # no step left to fail
        finally:
            fake.armed = False
            if lab is not None:
                lab.close()
            leftover = [ns for ns in fake.namespaces if netns_exists(ns)]
            assert not leftover, f"ip call {fail_at} failing left {leftover}"
    else:
        pytest.fail("setup never completed")
    assert fail_at > 10


def test_close_goes_on_past_a_failing_step(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    lab.add_host("a")
    lab.add_host("b")
    fake = FailingIp(fail_at=1, after=False)  # the first `ip netns del` fails
    monkeypatch.setattr(netns, "_ip", fake)
    with pytest.raises(LabError, match="teardown incomplete: injected"):
        lab.close()
    assert len(lab.namespaces) == 1  # only the failed one is left, and still recorded
    lab.close()  # so a retry (here: the fixture's) finishes the job
    assert not lab.namespaces


def rackboot(*args: str) -> list[str]:
    return [sys.executable, "-m", "appliance", *args]


def wait_for_status(host: Host, sock: Path, proc: subprocess.Popen, log: Path) -> dict[str, Any]:
    """Poll `rackboot status` until the node says it is ready (every service started, the
    role taken: the control socket answers before that): bounded by a deadline and a count."""
    deadline = time.monotonic() + 20.0
    for _ in range(200):
        if proc.poll() is not None:
            pytest.fail(f"node exited {proc.returncode} before answering:\n{log.read_text()}")
        res = host.run(rackboot("status", "--json", "--socket", str(sock)), timeout=10)
        if res.returncode == 0 and (status := json.loads(res.stdout))["core"]["ready"]:
            return status
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    pytest.fail(f"node not ready on {sock} within 20 s: {res.stderr}\n{log.read_text()}")


def test_rackboot_node_runs_inside_a_namespace(lab: Lab, tmp_path: Path) -> None:
    host = lab.add_host("node")
    data = tmp_path / "data"
    config = tmp_path / "rackboot.toml"
    config.write_text(f'[node]\nname = "lab-node"\ndata_dir = "{data}"\n')
    sock = data / "control.sock"
    log = tmp_path / "node.log"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}  # never the real user's dir
    with log.open("w") as out:
        proc = host.popen(
            rackboot("run", "--dev", "--config", str(config)),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=tmp_path,
        )  # fmt: skip

    core = wait_for_status(host, sock, proc, log)["core"]
    assert core["role"] == "active"
    assert core["pid"] == proc.pid and core["name"] == "lab-node" and core["data_dir"] == str(data)
    # The PID we hold is the node itself, and it lives in the lab's namespace.
    assert os.stat(f"/proc/{proc.pid}/ns/net").st_ino == os.stat(f"/run/netns/{host.ns}").st_ino

    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"node ignored SIGTERM for 15 s:\n{log.read_text()}")
    assert rc == 0, log.read_text()
    assert not sock.exists()


def test_bare_hosts_a_mac_of_choice_and_a_host_on_two_labs(lab: Lab) -> None:
    client = lab.add_host("cli", bare=True, mac="52:54:00:ab:cd:ef")
    assert client.addr == "" and client.network == lab.network
    assert client.mac == "52:54:00:ab:cd:ef"
    res = client.run(["ip", "-4", "-o", "addr", "show", "dev", client.ifname], check=True)
    assert res.stdout == ""  # no address: what a DHCP client starts with
    router = lab.add_host("rtr")
    assert router.addr == str(lab.network.network_address + 1)  # bare hosts take no address

    with Lab(avoid=(lab,)) as far:
        assert far.network != lab.network
        leg = far.attach(router)
        assert (leg.ns, leg.network) == (router.ns, far.network) and leg.ifname != router.ifname
        peer = far.add_host("peer")
        probe = [
            sys.executable,
            "-c",
            "import socket,sys; socket.create_connection((sys.argv[1], 9), 2)",
        ]
        res = peer.run([*probe, leg.addr])  # refused, not unreachable: the router answered
        assert "ConnectionRefusedError" in res.stderr, res.stderr
        with pytest.raises(ValueError):
            far.attach(router)  # once per lab
    # Closing the far lab takes the router's second leg with it (asynchronously), nothing else.
    deadline = time.monotonic() + 10
    while router.run(["ip", "-o", "link", "show", "dev", leg.ifname]).returncode == 0:
        assert time.monotonic() < deadline, f"{leg.ifname} outlived its lab"
        time.sleep(0.05)
    assert (
        netns_exists(router.ns)
        and router.run(["ip", "link", "show", router.ifname]).returncode == 0
    )
