"""One client cannot take the HTTP boot service down (issue 16), with real clients.

Namespace ``fld`` floods a node (the shipped defaults: 512 connections, 10 s for a
request head) with 600 slowloris connections (bench/http/slowloris.py: a head that
never ends, a byte a second, reopened when closed); meanwhile curl in namespace
``cli`` fetches a file and a boot script, each within ``BOUND`` seconds, and a slow
download lasting longer than the head deadline is not cut. Before per-source limits
the flood held the whole table and curl got 503.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.netns import Host, Lab
from tests.support.nodeproc import start_node

ROOT = Path(__file__).resolve().parents[2]
FLOOD = 600  # the figure: more than max_connections (512)
BOUND = 5.0  # seconds each legitimate request may take under the flood (it takes < 0.5)
FILE_BYTES = 16 << 20
SLOW_RATE = 1 << 20  # bytes/s: the slow download takes 12 s, past request_timeout (10 s)
SLOW_BYTES = 12 << 20
MAC = "52-54-00-77-00-20"
# No DHCP here, so no lease binds a machine's script to its address: any may fetch it.
UNBOUND = "bind_tokens_to_lease = false\n"


def status(srv: Host, sock: Path) -> dict:
    res = srv.run([sys.executable, "-m", "appliance", "status", "--json", "--socket", str(sock)])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["httpboot"]


def curl(cli: Host, url: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = ["curl", "-sS", "--fail", "--max-time", str(BOUND), *extra, "-o", str(out), url]
    return cli.run(argv, timeout=BOUND + 10)


def test_a_slowloris_flood_from_one_source_leaves_curl_served(lab: Lab, tmp_path: Path):
    srv, fld, cli = lab.add_host("srv"), lab.add_host("fld"), lab.add_host("cli")
    root, data = tmp_path / "root", tmp_path / "data"
    root.mkdir()
    (root / "vmlinuz").write_bytes(os.urandom(FILE_BYTES))
    (root / "slow.img").write_bytes(os.urandom(SLOW_BYTES))
    config = tmp_path / "rackboot.toml"
    config.write_text(
        f'[node]\nname = "flood"\ndata_dir = "{data}"\n[plugins]\ndisabled = ["dhcp", "tftp"]\n'
        f'[httpboot]\naddresses = ["{srv.addr}"]\nroot = "{root}"\n{UNBOUND}'
    )
    sock = data / "control.sock"
    start_node(srv, config, sock, tmp_path, "httpboot")
    flood = fld.popen(
        [sys.executable, "-m", "bench.http.slowloris", srv.addr, "80",
         "--connections", str(FLOOD), "--seconds", "60"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15.0  # 600 connects take well under a second here
    while True:
        seen = status(srv, sock)
        if seen["connections"] + seen["rejected_connections"] >= FLOOD:
            break
        assert flood.poll() is None, flood.stderr.read().decode()
        assert time.monotonic() < deadline, f"the flood did not arrive: {seen}"
        time.sleep(0.1)
    slow_out = tmp_path / "slow.out"
    slow = cli.popen(
        ["curl", "-sS", "--fail", "--limit-rate", str(SLOW_RATE), "-o", str(slow_out),
         f"http://{srv.addr}/boot/slow.img"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    for path, out in (
        (f"/boot/{MAC}.ipxe", tmp_path / "script"),
        ("/boot/vmlinuz", tmp_path / "file"),
    ):
        started = time.monotonic()
        res = curl(cli, f"http://{srv.addr}{path}", out)
        took = time.monotonic() - started
        assert res.returncode == 0 and took < BOUND, f"{path}: {res.stderr} after {took:.2f} s"
    assert (tmp_path / "file").read_bytes() == (root / "vmlinuz").read_bytes()
    assert (tmp_path / "script").read_text().startswith("#!ipxe\n")
    under_flood = status(srv, sock)
    _, err = slow.communicate(timeout=SLOW_BYTES / SLOW_RATE + 20)
    assert slow.returncode == 0, err.decode()  # 12 s: a download is not cut at the head deadline
    assert slow_out.read_bytes() == (root / "slow.img").read_bytes()
    assert under_flood["rejected"]["per-source"] > 0
    assert under_flood["active_connections"] <= 32 + 2  # the flood's share, curl's two
    assert status(srv, sock)["timeouts"]["send"] == 0
