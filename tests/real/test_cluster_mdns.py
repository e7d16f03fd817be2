"""The cluster in network namespaces: nodes find each other by mDNS (python-zeroconf) and
link over TLS after `cluster init` on one and `cluster join TOKEN` on the others; avahi, a
real third-party mDNS stack, sees the service. Every wait is bounded; only our PIDs are stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.netns import Host, Lab, have_commands

PORT = 7470


def rackboot(*args: str) -> list[str]:
    return [sys.executable, "-m", "appliance", *args]


def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}  # never the real user's dir


def write_config(tmp_path: Path, host: Host, name: str) -> Path:
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f'[node]\nname = "{name}"\ndata_dir = "{tmp_path / name}"\n'
        f'[cluster]\nlisten = "{host.addr}"\nport = {PORT}\nmdns = true\n'
        "keepalive = 0.3\ndead_after = 2.0\nbackoff_max = 1.0\n"
        '[plugins]\ndisabled = ["dhcp", "tftp", "httpboot"]\n'
    )
    return config


def start(tmp_path: Path, host: Host, name: str) -> tuple[subprocess.Popen, Path]:
    config = write_config(tmp_path, host, name)
    log = tmp_path / f"{name}.log"
    with log.open("w") as out:
        proc = host.popen(
            rackboot("run", "--config", str(config)),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env(tmp_path), cwd=tmp_path,
        )  # fmt: skip
    return proc, config


def cli(tmp_path: Path, host: Host, config: Path, *args: str) -> subprocess.CompletedProcess:
    return host.run(rackboot(*args, "--config", str(config)), timeout=30, env=env(tmp_path))


def status(tmp_path: Path, host: Host, config: Path) -> dict[str, Any] | None:
    res = cli(tmp_path, host, config, "status", "--json")
    return json.loads(res.stdout)["core"] if res.returncode == 0 else None


def wait(predicate, timeout: float, what: str, logs: list[Path]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    dump = "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in logs if p.exists())
    pytest.fail(f"timed out after {timeout} s waiting for {what}\n{dump}")


@pytest.mark.parametrize("count", [2, 3])
def test_nodes_discover_each_other_by_mdns_and_link(lab: Lab, tmp_path: Path, count: int) -> None:
    names = ["alpha", "beta", "gamma"][:count]
    hosts = {n: lab.add_host(n[:5]) for n in names}
    nodes = {n: start(tmp_path, hosts[n], n) for n in names}
    logs = [tmp_path / f"{n}.log" for n in names]
    for n in names:
        wait(lambda n=n: status(tmp_path, hosts[n], nodes[n][1]), 20, f"{n} to answer", logs)

    made = cli(tmp_path, hosts["alpha"], nodes["alpha"][1], "cluster", "init")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    assert token.startswith("rbj1.") and "CA holder" in made.stdout
    for n in names[1:]:
        if n != names[1]:  # each token is good once: a new one for every joiner
            token = cli(tmp_path, hosts["alpha"], nodes["alpha"][1], "cluster", "token")
            token = token.stdout.strip().splitlines()[-1]
        joined = cli(tmp_path, hosts[n], nodes[n][1], "cluster", "join", token)
        assert joined.returncode == 0, joined.stderr + (tmp_path / f"{n}.log").read_text()

    def everyone_linked() -> bool:
        for n in names:
            core = status(tmp_path, hosts[n], nodes[n][1])
            site = {r["name"]: r for r in (core or {}).get("cluster", {}).get("site", [])}
            if not all(site.get(o, {}).get("health") == "online" for o in names if o != n):
                return False
            # Found by mDNS, not only through the enrolling member's address.
            if not all("mdns" in site[o]["sources"] for o in names if o != n):
                return False
        return True

    wait(everyone_linked, 60, f"{count} nodes to discover and link to each other", logs)
    core = status(tmp_path, hosts[names[-1]], nodes[names[-1]][1])
    site = {r["name"]: r for r in core["cluster"]["site"]}
    assert site["alpha"]["address"] == f"{hosts['alpha'].addr}:{PORT}"
    human = cli(tmp_path, hosts["alpha"], nodes["alpha"][1], "status")
    assert all(n in human.stdout for n in names) and "online" in human.stdout

    # One member goes away: the others show it offline, then back when it returns.
    last = names[-1]
    proc = nodes[last][0]
    proc.terminate()
    assert proc.wait(timeout=15) == 0

    def shown_offline() -> bool:
        site = status(tmp_path, hosts["alpha"], nodes["alpha"][1])["cluster"]["site"]
        return {r["name"]: r["health"] for r in site}.get(last) == "offline"

    wait(shown_offline, 15, f"{last} shown offline", logs)
    nodes[last] = start(tmp_path, hosts[last], last)
    wait(everyone_linked, 60, f"{last} back online", logs)

    # A member that stops answering without closing anything (frozen): marked down after
    # dead_after, back when it thaws. Only our own PID is signalled.
    frozen = nodes[last][0]
    os.kill(frozen.pid, signal.SIGSTOP)
    try:

        def silent() -> bool:
            site = status(tmp_path, hosts["alpha"], nodes["alpha"][1])["cluster"]["site"]
            row = {r["name"]: r for r in site}[last]
            # First "no keepalive ...", then redials time out while it stays frozen.
            return row["health"] == "offline" and (
                "no keepalive" in row["reason"] or "timed out" in row["reason"]
            )

        wait(silent, 15, f"frozen {last} marked down", logs)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    wait(everyone_linked, 60, f"{last} back after thawing", logs)


AVAHI_CONF = """[server]
use-ipv4=yes
use-ipv6=no
allow-interfaces={ifname}
enable-dbus=yes
ratelimit-interval-usec=0
[publish]
disable-publishing=yes
[reflector]
[rlimits]
"""

DBUS_CONF = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={path}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""


def test_avahi_browse_sees_the_service(lab: Lab, tmp_path: Path) -> None:
    """avahi-browse talks to avahi-daemon over the D-Bus *system* bus. The test brings a
    private bus (its own dbus-daemon on a socket under tmp_path, named by
    DBUS_SYSTEM_BUS_ADDRESS) and an avahi-daemon in a namespace of its own on the lab
    bridge; `ip netns exec` gives that daemon a private mount namespace, where a tmpfs
    over /run/avahi-daemon keeps its pid file from colliding with any host avahi."""
    if not have_commands("avahi-daemon", "avahi-browse", "dbus-daemon"):
        pytest.skip("needs avahi-daemon, avahi-utils and dbus (tests/debian-packages.txt)")
    node_host, avahi_host = lab.add_host("node"), lab.add_host("avahi")
    proc, config = start(tmp_path, node_host, "alpha")
    logs = [tmp_path / "alpha.log", tmp_path / "avahi.log", tmp_path / "dbus.log"]
    wait(lambda: status(tmp_path, node_host, config), 20, "the node to answer", logs)
    made = cli(tmp_path, node_host, config, "cluster", "init")
    assert made.returncode == 0, made.stderr
    node_id = status(tmp_path, node_host, config)["cluster"]["node_id"]

    bus = tmp_path / "bus"
    (tmp_path / "dbus.conf").write_text(DBUS_CONF.format(path=bus))
    (tmp_path / "avahi.conf").write_text(AVAHI_CONF.format(ifname=avahi_host.ifname))
    bus_env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={bus}"}
    with (tmp_path / "dbus.log").open("w") as out:
        avahi_host.popen(
            ["dbus-daemon", "--nofork", "--nopidfile", f"--config-file={tmp_path / 'dbus.conf'}"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    wait(bus.exists, 10, "the private D-Bus socket", logs)
    script = (
        "mkdir -p /run/avahi-daemon && mount -t tmpfs rbtavahi /run/avahi-daemon && "
        f"exec avahi-daemon --no-drop-root --no-chroot --no-rlimits -f {tmp_path / 'avahi.conf'}"
    )
    with (tmp_path / "avahi.log").open("w") as out:
        avahi_host.popen(
            ["sh", "-c", script],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=bus_env,
        )  # fmt: skip

    def browse() -> str | None:
        res = avahi_host.run(
            ["avahi-browse", "--parsable", "--resolve", "--terminate", "_rackboot._tcp"],
            env=bus_env, timeout=15,
        )  # fmt: skip
        lines = [line for line in res.stdout.splitlines() if line.startswith("=")]
        return next((line for line in lines if f"node={node_id}" in line), None)

    line = wait(browse, 30, "avahi-browse to resolve _rackboot._tcp", logs)
    fields = line.split(";")
    assert fields[2] == "IPv4" and fields[4] == "_rackboot._tcp"
    assert fields[7] == node_host.addr and fields[8] == str(PORT)
    assert '"rack=rack1"' in line and '"cluster=' in line and '"version=' in line
