"""Real TFTP clients from Debian fetch from a Rackboot node in a namespace lab.

One lab for the module: the node (``python -m appliance run``, port 69) in
namespace ``srv``, the clients (tftp-hpa, atftp, curl, busybox tftp) in ``cli``.
Every client run has a timeout; the lab stops the node (by its PID) at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.netns import Host, Lab

CLIENT_TIMEOUT = 60.0
READY_TIMEOUT = 20.0
CLIENTS = ("tftp", "atftp", "curl", "busybox")
MTU = 9000
LCM = 512 * 367 * 16  # 3,006,464: a multiple of 512, 1468 and 8192 (an empty final block)


@dataclass
class Served:
    srv: Host
    cli: Host
    root: Path
    outside: Path
    log: Path
    work: Path


def _wait_ready(host: Host, sock: Path, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"node exited {proc.returncode}:\n{log.read_text()}")
        res = host.run(
            [sys.executable, "-m", "appliance", "status", "--json", "--socket", str(sock)]
        )
        if res.returncode == 0 and json.loads(res.stdout).get("tftp", {}).get("listening"):
            return
        time.sleep(0.05)
    pytest.fail(f"node not ready within {READY_TIMEOUT} s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def served(netns_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    missing = [c for c in CLIENTS if not shutil.which(c)]
    if missing:
        pytest.skip(f"TFTP clients not installed: {', '.join(missing)} (tests/debian-packages.txt)")
    work = tmp_path_factory.mktemp("tftp")
    root, outside = work / "root", work / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "boot").mkdir()
    (root / "boot" / "pxelinux.0").write_bytes(os.urandom(50_000))
    (root / "exact.bin").write_bytes(os.urandom(LCM))
    (root / "big.bin").write_bytes(os.urandom(2 << 20))
    (outside / "secret.txt").write_text("SECRET\n")
    plant_symlinks(root, outside)
    with Lab() as lab:
        srv, cli = lab.add_host("srv"), lab.add_host("cli")
        jumbo(lab)
        data = work / "data"
        config = work / "rackboot.toml"
        config.write_text(
            f'[node]\nname = "tftp-lab"\ndata_dir = "{data}"\n'
            f'[tftp]\naddresses = ["{srv.addr}"]\nroot = "{root}"\n'
        )
        log = work / "node.log"
        env = {**os.environ, "XDG_DATA_HOME": str(work / "xdg")}
        with log.open("w") as out:
            proc = srv.popen(
                [sys.executable, "-m", "appliance", "run", "--config", str(config)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=work,
            )  # fmt: skip
        _wait_ready(srv, data / "control.sock", proc, log)
        yield Served(srv, cli, root, outside, log, work)


def jumbo(lab: Lab) -> None:
    """MTU 9000 on every lab link, so blksize 8192 fits one datagram (the server
    clamps blksize to the receiving interface's MTU: 8968 here)."""
    links = json.loads(subprocess.run(["ip", "-n", lab.bridge_ns, "-j", "link", "show"],
                                      capture_output=True, text=True, timeout=10, check=True).stdout)  # fmt: skip
    for link in links:
        if link["ifname"] != "lo":
            subprocess.run(["ip", "-n", lab.bridge_ns, "link", "set", link["ifname"], "mtu", str(MTU)],
                           check=True, timeout=10)  # fmt: skip
    for host in lab.hosts.values():
        subprocess.run(["ip", "-n", host.ns, "link", "set", host.ifname, "mtu", str(MTU)],
                       check=True, timeout=10)  # fmt: skip


def plant_symlinks(root: Path, outside: Path) -> None:
    """Links a careless server follows out of its root, and one it may follow."""
    (root / "escape").symlink_to(outside / "secret.txt")  # absolute, outside
    (root / "rel").symlink_to("../outside/secret.txt")  # relative, outside
    (root / "dirlink").symlink_to(outside)  # a directory outside
    (root / "boot" / "up").symlink_to("../../outside/secret.txt")  # two levels up
    (root / "rootlink").symlink_to("/")
    (root / "loop").symlink_to("loop")
    (root / "inside").symlink_to("boot/pxelinux.0")  # stays inside: served


def client_argv(
    client: str, srv: Host, name: str, dest: Path, options: dict[str, str]
) -> list[str]:
    blksize = options.get("blksize", "512")
    if client == "tftp":  # tftp-hpa: RFC 1350 only, no options
        return ["tftp", "-m", "binary", srv.addr, "-c", "get", name, str(dest)]
    if client == "atftp":
        opts = [a for k, v in options.items() for a in ("--option", f"{k} {v}")]
        return ["atftp", "--trace", *opts, "-g", "-r", name, "-l", str(dest), srv.addr]
    if client == "curl":
        return ["curl", "-sS", "--fail", "--tftp-blksize", blksize, "-o", str(dest),
                f"tftp://{srv.addr}/{name}"]  # fmt: skip
    return ["busybox", "tftp", "-b", blksize, "-g", "-r", name, "-l", str(dest), srv.addr]


def sent_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "msg=sent " in line]


def wait_logged(log: Path, before: int) -> str:
    """The node logs a transfer once the final ACK is in: poll briefly (bounded)."""
    for _ in range(100):
        lines = sent_lines(log)
        if len(lines) > before:
            return lines[-1]
        time.sleep(0.02)
    pytest.fail(f"no transfer logged:\n{log.read_text()[-2000:]}")


MATRIX = [("tftp", 512)] + [(c, b) for c in ("atftp", "curl", "busybox") for b in (512, 1468, 8192)]


@pytest.mark.parametrize(("client", "blksize"), MATRIX)
def test_clients_fetch_byte_identical_with_tsize(served: Served, client: str, blksize: int):
    dest = served.work / f"{client}-{blksize}.out"
    options = {} if client == "tftp" else {"blksize": str(blksize), "tsize": "0"}
    before = len(sent_lines(served.log))
    res = served.cli.run(client_argv(client, served.srv, "exact.bin", dest, options),
                         timeout=CLIENT_TIMEOUT)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert dest.read_bytes() == (served.root / "exact.bin").read_bytes()
    line = wait_logged(served.log, before)
    assert f"blksize={blksize}" in line
    if client != "tftp":
        assert f"tsize={LCM}" in line  # negotiated: the client sent tsize and got the size
    dest.unlink()


def test_blksize_is_clamped_to_the_interface_mtu(served: Served):
    dest = served.work / "clamped.out"
    before = len(sent_lines(served.log))
    res = served.cli.run(client_argv("curl", served.srv, "big.bin", dest, {"blksize": "65464"}),
                         timeout=CLIENT_TIMEOUT)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert dest.read_bytes() == (served.root / "big.bin").read_bytes()
    assert f"blksize={MTU - 32}" in wait_logged(served.log, before)  # IP 20 + UDP 8 + TFTP 4


def test_atftp_windowsize_16(served: Served):
    dest = served.work / "window.out"
    before = len(sent_lines(served.log))
    options = {"blksize": "1468", "windowsize": "16", "tsize": "0"}
    res = served.cli.run(client_argv("atftp", served.srv, "big.bin", dest, options),
                         timeout=CLIENT_TIMEOUT)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"received OACK <[^>]*windowsize: 16", res.stdout + res.stderr)
    assert dest.read_bytes() == (served.root / "big.bin").read_bytes()
    assert "windowsize=16" in wait_logged(served.log, before)


def tftp_status(served: Served) -> dict:
    sock = served.work / "data" / "control.sock"
    res = served.srv.run(
        [sys.executable, "-m", "appliance", "status", "--json", "--socket", str(sock)]
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["tftp"]


def test_a_window_past_the_send_buffer_waits_for_room(served: Served):
    """A token bucket on the server's link holds its datagrams in the queue, where they
    still count against the socket's send buffer (~208 KiB by default): a window of
    64 x 8192 bytes cannot fit, the rest of it waits for EPOLLOUT, and the file
    still arrives intact."""
    dev = served.srv.ifname
    qdisc = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", "200mbit",
             "burst", "64kb", "latency", "1s"]  # fmt: skip
    added = served.srv.run(qdisc, capture_output=True, text=True, timeout=10)
    if added.returncode != 0:
        pytest.skip(f"no tbf qdisc in this kernel: {added.stderr.strip()}")
    before = tftp_status(served)["send_buffer_full"]
    try:
        dest = served.work / "parked.out"
        options = {"blksize": "8192", "windowsize": "64", "tsize": "0"}
        res = served.cli.run(client_argv("atftp", served.srv, "big.bin", dest, options),
                             timeout=CLIENT_TIMEOUT)  # fmt: skip
    finally:
        served.srv.run(["tc", "qdisc", "del", "dev", dev, "root"], check=True, timeout=10)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"received OACK <[^>]*windowsize: 64", res.stdout + res.stderr)
    assert dest.read_bytes() == (served.root / "big.bin").read_bytes()
    assert tftp_status(served)["send_buffer_full"] > before


def test_block_numbers_wrap_past_65535(served: Served):
    wrap = served.root / "wrap.bin"
    wrap.write_bytes(os.urandom(512 * 65_600))  # 65,601 blocks of 512
    dest = served.work / "wrap.out"
    res = served.cli.run(client_argv("curl", served.srv, "wrap.bin", dest, {}), timeout=120)
    assert res.returncode == 0, res.stderr
    assert dest.read_bytes() == wrap.read_bytes()


def test_fifty_concurrent_transfers(served: Served):
    procs = []
    for i in range(50):
        dest = served.work / f"conc-{i}.out"
        argv = client_argv(CLIENTS[1 + i % 3], served.srv, "big.bin", dest, {"blksize": "1468"})
        procs.append(
            (served.cli.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), dest)
        )
    want = (served.root / "big.bin").read_bytes()
    for proc, dest in procs:
        out, _ = proc.communicate(timeout=CLIENT_TIMEOUT * 2)
        assert proc.returncode == 0, out
        assert dest.read_bytes() == want
        dest.unlink()


# name asked -> the error the client must print (code, text); the text names only the request
TRAVERSAL = {
    "../outside/secret.txt": (2, "access violation"),
    "/../outside/secret.txt": (2, "access violation"),
    "boot/../../outside/secret.txt": (2, "access violation"),
    "..\\outside\\secret.txt": (2, "access violation"),
    "escape": (2, "access violation"),
    "rel": (2, "access violation"),
    "dirlink/secret.txt": (2, "access violation"),
    "boot/up": (2, "access violation"),
    "rootlink/etc/passwd": (2, "access violation"),
    "loop": (2, "access violation"),
    "boot": (2, "access violation"),
    "/etc/passwd": (1, "file not found"),  # a leading / is relative to the root
    "%2e%2e/outside/secret.txt": (1, "file not found"),
}


@pytest.mark.parametrize("client", ["tftp", "busybox"])
def test_traversal_is_refused_every_time(served: Served, client: str):
    # Absolute paths of the planted files, asked for as they are: relative to the root too.
    cases = {**TRAVERSAL, str(served.outside / "secret.txt"): (1, "file not found")}
    for name, (code, text) in cases.items():
        dest = served.work / "traversal.out"
        res = served.cli.run(
            client_argv(client, served.srv, name, dest, {}), timeout=CLIENT_TIMEOUT
        )
        output = res.stdout + res.stderr
        assert f"{name}: {text}" in output, (name, output)
        if client == "tftp":
            assert f"Error code {code}:" in output, (name, output)
        assert str(served.root) not in output.replace(name, "")  # the root never shows
        assert not dest.exists() or b"SECRET" not in dest.read_bytes()
        dest.unlink(missing_ok=True)
    res = served.cli.run(
        client_argv(client, served.srv, "inside", dest, {}), timeout=CLIENT_TIMEOUT
    )
    assert dest.read_bytes() == (served.root / "boot" / "pxelinux.0").read_bytes(), res.stderr
