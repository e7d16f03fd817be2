"""Real HTTP clients from Debian against a Rackboot node in a namespace lab.

One lab for the module: the node (``python -m appliance run``, port 80, DHCP on its
interface) and, for the symlink comparison, nginx (Debian's defaults:
``disable_symlinks off``) in namespace ``srv``; curl, wget and busybox wget in ``cli``
(a fixed address, no lease); the installer's requests from ``mach``, a machine that
takes its address with udhcpc: only its leased address gets its script and token, and
posts its events (``bind_tokens_to_lease``, the configured default). Every client run
has a timeout; the lab stops the node, nginx and udhcpc (by PID) at the end.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.dhcplab import Udhcpc
from tests.support.netns import Host, Lab
from tests.support.nodeproc import start_node

CLIENT_TIMEOUT = 60.0
NGINX_PORT = 8081
BIG = 48 << 20
SECRET = b"SECRET-OUTSIDE-THE-ROOT\n"
MAC = "52-54-00-77-00-10"  # the machine's, in its URLs


@dataclass
class Served:
    srv: Host
    cli: Host
    root: Path
    work: Path
    nginx: bool
    machine: Host  # holds the DHCP lease of MAC (udhcpc)

    def url(self, path: str, port: int = 80) -> str:
        return f"http://{self.srv.addr}{'' if port == 80 else f':{port}'}{path}"

    def curl(self, *args: str, host: Host | None = None) -> subprocess.CompletedProcess:
        return (host or self.cli).run(["curl", "-sS", *args], timeout=CLIENT_TIMEOUT)


def _start_nginx(srv: Host, root: Path, work: Path) -> bool:
    """nginx as Debian configures a site, root = ours, sendfile on; False if not installed."""
    if not shutil.which("nginx"):
        return False
    conf = work / "nginx.conf"
    conf.write_text(
        f"user root; daemon off; worker_processes 1; pid {work}/nginx.pid;\n"
        f"error_log {work}/nginx-error.log;\n"
        "events { worker_connections 256; }\n"
        f"http {{ access_log off; sendfile on; server {{ listen {srv.addr}:{NGINX_PORT};\n"
        f"  root {root}; }} }}\n"
    )
    proc = srv.popen(["nginx", "-c", str(conf), "-p", str(work)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    for _ in range(200):
        if proc.poll() is not None:
            pytest.fail(f"nginx exited {proc.returncode}: {(work / 'nginx-error.log').read_text()}")
        if (
            srv.run(
                ["curl", "-s", "-o", "/dev/null", f"http://{srv.addr}:{NGINX_PORT}/"]
            ).returncode
            == 0
        ):
            return True
        time.sleep(0.05)
    pytest.fail("nginx did not answer")


@pytest.fixture(scope="module")
def served(netns_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    missing = [c for c in ("curl", "wget", "busybox", "udhcpc") if not shutil.which(c)]
    if missing:
        pytest.skip(f"HTTP clients not installed: {', '.join(missing)} (tests/debian-packages.txt)")
    work = tmp_path_factory.mktemp("http")
    root, outside = work / "root", work / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "big.bin").write_bytes(os.urandom(BIG))
    (root / "ipxe.efi").write_bytes(b"MZ" + os.urandom(100_000))
    (outside / "secret.txt").write_bytes(SECRET)
    (root / "escape").symlink_to(outside / "secret.txt")  # planted: leads out of the root
    (root / "dirlink").symlink_to(outside)
    with Lab() as lab:
        srv, cli = lab.add_host("srv"), lab.add_host("cli")
        data = work / "data"
        config = work / "rackboot.toml"
        pool = f"{lab.network.network_address + 100}-{lab.network.network_address + 120}"
        config.write_text(
            f'[node]\nname = "http-lab"\ndata_dir = "{data}"\n'
            '[plugins]\ndisabled = ["tftp"]\n'
            f'[dhcp]\ninterfaces = ["{srv.ifname}"]\n'
            f'[[dhcp.subnets]]\nnetwork = "{lab.network}"\npools = ["{pool}"]\n'
            f'[httpboot]\naddresses = ["{srv.addr}"]\nroot = "{root}"\n'
            '[[httpboot.profiles]]\nname = "default"\nkernel = "vmlinuz"\n'
            'initrd = ["initrd.img"]\ncmdline = "console=ttyS0"\n'
        )
        start_node(srv, config, data / "control.sock", work, "httpboot")
        nginx = _start_nginx(srv, root, work)
        machine = lab.add_host("mach", bare=True, mac=MAC.replace("-", ":"))
        leased = Udhcpc(machine, work / "udhcpc").start().wait("bound")
        machine = dataclasses.replace(machine, addr=leased["ip"])
        yield Served(srv, cli, root, work, nginx, machine)


def test_curl_and_wget_download_byte_identical(served: Served):
    for argv in (
        ["curl", "-sS", "--fail", "-o", str(served.work / "curl.out"), served.url("/boot/big.bin")],
        ["wget", "-q", "-O", str(served.work / "wget.out"), served.url("/boot/big.bin")],
        ["busybox", "wget", "-q", "-O", str(served.work / "bb.out"), served.url("/boot/big.bin")],
    ):
        res = served.cli.run(argv, timeout=CLIENT_TIMEOUT)
        assert res.returncode == 0, res.stderr
    content = (served.root / "big.bin").read_bytes()
    for name in ("curl.out", "wget.out", "bb.out"):
        assert (served.work / name).read_bytes() == content, name
        (served.work / name).unlink()


def test_ranges_and_resumed_downloads(served: Served):
    content = (served.root / "big.bin").read_bytes()
    part = served.work / "part.out"
    res = served.curl("--fail", "-r", "1000-1999", "-o", str(part), served.url("/boot/big.bin"))
    assert res.returncode == 0 and part.read_bytes() == content[1000:2000]
    for resume in (
        ["curl", "-sS", "--fail", "-C", "-", "-o", str(part), served.url("/boot/big.bin")],
        ["wget", "-q", "-c", "-O", str(part), served.url("/boot/big.bin")],
    ):
        part.write_bytes(content[: 7 << 20])  # an interrupted download
        res = served.cli.run(resume, timeout=CLIENT_TIMEOUT)
        assert res.returncode == 0, res.stderr
        assert part.read_bytes() == content, resume[0]
    past = served.curl(
        "-o", "/dev/null", "-w", "%{http_code}", "-r", f"{BIG}-", served.url("/boot/big.bin")
    )
    assert past.stdout == "416"
    part.unlink()


def test_head_conditional_get_and_keep_alive(served: Served):
    head = served.curl("-I", served.url("/boot/ipxe.efi"))
    assert "HTTP/1.1 200 OK" in head.stdout
    assert "content-length: 100002" in head.stdout.lower()
    assert "content-type: application/efi" in head.stdout.lower()
    copy = served.work / "ipxe.efi"
    shutil.copy2(served.root / "ipxe.efi", copy)  # same mtime: curl -z sends If-Modified-Since
    unchanged = served.curl(
        "-o", "/dev/null", "-w", "%{http_code}", "-z", str(copy), served.url("/boot/ipxe.efi")
    )
    assert unchanged.stdout == "304"
    both = served.curl("-v", "-o", "/dev/null", "-o", "/dev/null",
                       served.url("/boot/ipxe.efi"), served.url("/boot/ipxe.efi"))  # fmt: skip
    assert both.returncode == 0 and "Re-using existing connection" in both.stderr


def test_the_documented_installer_requests_record_events(served: Served):
    machine = served.machine
    script = served.curl("--fail", served.url(f"/boot/{MAC}.ipxe"), host=machine).stdout
    params = dict(arg.split("=", 1) for arg in script.split() if arg.startswith("rackboot."))
    events, token = params["rackboot.events"], params["rackboot.token"]
    assert events == served.url(f"/api/v1/machines/{MAC}/events")
    by_curl = served.curl("-fsS", "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
                          "--data", '{"stage":"partitioned","status":"ok"}', events, host=machine)  # fmt: skip
    assert by_curl.returncode == 0, by_curl.stderr
    by_busybox = machine.run(
        ["busybox", "wget", "-q", "-O", "-", "--header", f"Authorization: Bearer {token}",
         "--header", "Content-Type: application/json",
         "--post-data", '{"stage":"installed","status":"ok","message":"disk written"}', events],
        timeout=CLIENT_TIMEOUT,
    )  # fmt: skip
    assert by_busybox.returncode == 0, by_busybox.stderr
    assert json.loads(by_busybox.stdout)["seq"] == 2
    refused = served.curl("-o", "/dev/null", "-w", "%{http_code}", "--data", "{}", events,
                          host=machine)  # fmt: skip
    assert refused.stdout == "401"
    # the same token from an address that holds no lease of the machine: 403, its script too
    elsewhere = served.curl("-o", "/dev/null", "-w", "%{http_code}", "-H",
                            f"Authorization: Bearer {token}", "--data", "{}", events)  # fmt: skip
    assert elsewhere.stdout == "403"
    stranger = served.curl("-w", "\n%{http_code}", served.url(f"/boot/{MAC}.ipxe"))
    assert stranger.stdout.endswith("\n403") and token not in stranger.stdout
    made_up = served.curl("-o", "/dev/null", "-w", "%{http_code}", "-H",
                          f"Authorization: Bearer {token}", "--data", "{}",
                          served.url("/api/v1/machines/52-54-00-99-99-99/events"))  # fmt: skip
    assert made_up.stdout == "404"
    machine = json.loads(served.curl("--fail", served.url(f"/api/v1/machines/{MAC}")).stdout)
    assert (machine["stage"], [e["stage"] for e in machine["events"]]) == (
        "installed", ["partitioned", "installed"],
    )  # fmt: skip


@pytest.mark.parametrize(
    "path",
    ["/boot/escape", "/boot/dirlink/secret.txt", "/boot/../outside/secret.txt",
     "/boot/%2e%2e/outside/secret.txt", "/boot/..%2foutside%2fsecret.txt"],
)  # fmt: skip
def test_planted_symlinks_and_traversal_never_leave_the_root(served: Served, path: str):
    ours = served.curl("--path-as-is", "-w", "\n%{http_code}", served.url(path))
    body, _, code = ours.stdout.rpartition("\n")
    assert code in ("403", "404") and SECRET.decode().strip() not in body
    assert str(served.root) not in body and "outside" not in body


def test_nginx_with_its_defaults_follows_the_planted_symlink_out(served: Served):
    """The difference the issue asks to prove: the same root, the same request."""
    if not served.nginx:
        pytest.skip("nginx is not installed (nginx-light in tests/debian-packages.txt)")
    theirs = served.curl("--fail", served.url("/escape", NGINX_PORT))
    assert theirs.returncode == 0 and theirs.stdout.encode() == SECRET
    ours = served.curl("-w", "%{http_code}", "-o", "/dev/null", served.url("/boot/escape"))
    assert ours.stdout == "403"
