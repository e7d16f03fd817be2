"""The two sides of bench.netboot, each on its own lab link: a Rackboot node, and
dnsmasq (DHCP, TFTP, router advertisements) + nginx (the files, the scripts, the events).

Both serve the same kernel, initrd and ``ipxe.efi`` from their own copies, the
same TFTP ``boot.ipxe`` for BIOS, and the same per-machine iPXE script: nginx's is
the one Rackboot's renderer writes (:func:`plugins.httpboot.script.render_ipxe`),
saved as a static file per MAC with a fixed token. Every process is started
through ``Host.popen``, so its lab stops it by PID at close.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from appliance.lab.boot import CMDLINE, TFTP_SCRIPT, boot_sections  # as the tests boot
from bench.http.cli import cpu_seconds
from bench.netboot import timings
from plugins.httpboot.script import Machine, Profile, base_url, render_ipxe
from tests.support.dhcplab import Sniffer
from tests.support.netboot.node import NetbootNode
from tests.support.netns import Host, Lab

PEER_TOKEN = "static-" + "0" * 36  # the length of Rackboot's tokens; nginx checks nothing
READY_TIMEOUT = 30.0
# An RA-only IPv6 prefix for dnsmasq (it advertises only a prefix it has an address in).
PEER_PREFIX = "fd72:6b62:6e62::"


@dataclass(frozen=True)
class Files:
    kernel: Path
    initrd: Path
    ipxe_efi: Path


def pool(lab: Lab) -> tuple[str, str]:
    net = lab.network.network_address
    return str(net + 100), str(net + 250)


def fill_roots(work: Path, files: Files) -> tuple[Path, Path]:
    """``work/http`` (vmlinuz, initrd.img, ipxe.efi) and ``work/tftp`` (boot.ipxe)."""
    http_root, tftp_root = work / "http", work / "tftp"
    http_root.mkdir(parents=True, exist_ok=True)
    tftp_root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(files.kernel, http_root / "vmlinuz")
    shutil.copyfile(files.initrd, http_root / "initrd.img")
    shutil.copyfile(files.ipxe_efi, http_root / "ipxe.efi")
    (tftp_root / "boot.ipxe").write_text(TFTP_SCRIPT)
    return http_root, tftp_root


class RackbootSide:
    """``rackboot run``: DHCP, TFTP, HTTP boot with the events API, and the ``ra`` plugin
    (on by default), configured as tests/real/test_netboot.py does."""

    name = "rackboot"

    def __init__(self, lab: Lab, work: Path, firmware: str, files: Files) -> None:
        self.lab, self.work = lab, work
        self.srv = lab.add_host("srv")
        http_root, tftp_root = fill_roots(work, files)
        first, last = pool(lab)
        # BIOS: the classic "TFTP script, then HTTP"; UEFI: the boot table's defaults.
        boot = '[dhcp.boot]\nipxe_script = "boot.ipxe"\n' if firmware == "bios" else ""
        self.node = NetbootNode(self.srv, work / "node", f"""
[[dhcp.subnets]]
network = "{lab.network}"
pools = ["{first}-{last}"]
{boot}
{boot_sections(str(http_root), str(tftp_root), address=self.srv.addr)}
""", ready=("tftp", "httpboot"))  # fmt: skip

    def start(self) -> None:
        self.node.start()
        # The plugin answers after duplicate address detection and its 2 s listen: a
        # rack's appliance has been up for long; the benchmark boots no VM before it.
        deadline = time.monotonic() + READY_TIMEOUT
        while not self.node.status().get("ra", {}).get("answering"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"ra not answering: {self.node.status().get('ra')}")
            time.sleep(0.1)
        self.sniffer = Sniffer(self.srv, self.work)

    def prepare(self, macs: list[str]) -> None:
        """Nothing: Rackboot renders each machine's script when it is asked for."""

    def access(self) -> list[timings.Access]:
        return timings.rackboot_access(self.node.log_text())

    def cpu_seconds(self) -> float:
        """CPU time the node has used so far (it shares the vCPUs with the VMs)."""
        assert self.node.proc is not None
        return cpu_seconds(self.node.proc.pid)

    def recorded_event(self, mac: str) -> dict | None:
        """The ``installed`` event the node recorded for ``mac`` (its machine record)."""
        url = f"http://{self.srv.addr}/api/v1/machines/{mac.replace(':', '-')}"
        res = self.srv.run(["curl", "-sS", "--fail", "--max-time", "10", url], timeout=20)
        if res.returncode != 0:
            return None
        events = [e for e in json.loads(res.stdout).get("events", [])
                  if e.get("stage") == "installed" and e.get("status") == "ok"]  # fmt: skip
        return events[0] if events else None


class PeerSide:
    """dnsmasq (DHCP + TFTP + ``enable-ra``) and nginx (``worker_processes 1``)."""

    name = "dnsmasq+nginx"

    def __init__(self, lab: Lab, work: Path, firmware: str, files: Files) -> None:
        self.lab, self.work, self.firmware = lab, work, firmware
        self.srv = lab.add_host("srv")
        self.http_root, self.tftp_root = fill_roots(work, files)
        self.access_log = work / "nginx-access.log"

    def prepare(self, macs: list[str]) -> None:
        """Each machine's static script: what Rackboot would render, with a fixed token."""
        profile = Profile("default", "vmlinuz", ("initrd.img",), CMDLINE)
        for mac in macs:
            machine = Machine(mac, profile, base_url(self.srv.addr, 80), PEER_TOKEN)
            (self.http_root / f"{mac.replace(':', '-')}.ipxe").write_text(render_ipxe(machine))

    def start(self) -> None:
        srv, work = self.srv, self.work
        # dnsmasq advertises only a prefix configured on the interface; nodad: no wait.
        _ip(srv, "-6", "addr", "add", f"{PEER_PREFIX}1/64", "dev", srv.ifname, "nodad")
        _wait_link_local(srv)
        conf = work / "dnsmasq.conf"
        conf.write_text(dnsmasq_conf(srv, self.lab, self.firmware, self.tftp_root, work))
        self.dnsmasq = srv.popen(
            ["dnsmasq", "--keep-in-foreground", f"--conf-file={conf}"],
            stdout=subprocess.DEVNULL, stderr=(work / "dnsmasq.log").open("w"),
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        (work / "nginx.conf").write_text(nginx_conf(srv.addr, self.http_root, work))
        self.nginx = srv.popen(
            ["nginx", "-c", str(work / "nginx.conf"), "-p", str(work)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"dnsmasq or nginx not ready:\n{self._logs()}")
            time.sleep(0.05)
        self.sniffer = Sniffer(self.srv, self.work)

    def _ready(self) -> bool:
        for proc in (self.dnsmasq, self.nginx):
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}:\n{self._logs()}")
        udp = self.srv.run(["ss", "-Hlun", "sport = :67"], timeout=10).stdout
        http = self.srv.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                             f"http://{self.srv.addr}/boot/initrd.img"], timeout=10).stdout  # fmt: skip
        return bool(udp.strip()) and http == "200"

    def _logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-1500:]
                         for p in (self.work / "dnsmasq.log", self.work / "nginx-error.log")
                         if p.exists())  # fmt: skip

    def access(self) -> list[timings.Access]:
        text = self.access_log.read_text() if self.access_log.exists() else ""
        return timings.nginx_access(text)

    def cpu_seconds(self) -> float:
        """CPU time dnsmasq and nginx (its master and worker) have used so far."""
        return cpu_seconds(self.dnsmasq.pid) + cpu_seconds(self.nginx.pid)

    def recorded_event(self, mac: str) -> dict | None:
        return None  # nginx answers the POST and keeps nothing but its access line


def dnsmasq_conf(srv: Host, lab: Lab, firmware: str, tftp_root: Path, work: Path) -> str:
    """DHCP with the same pool and boot answers as the Rackboot side, TFTP for BIOS's
    ``boot.ipxe``, and RA-only router advertisements with router lifetime 0 (as the
    ``ra`` plugin sends: no host routes through the server)."""
    first, last = pool(lab)
    http = f"http://{srv.addr}/boot"
    lines = [
        "port=0",  # no DNS
        f"interface={srv.ifname}",
        "bind-interfaces",
        f"dhcp-range={first},{last},{lab.network.netmask},1h",
        f"dhcp-leasefile={work / 'dnsmasq.leases'}",
        "dhcp-authoritative",
        f"log-facility={work / 'dnsmasq.log'}",
        "log-dhcp",
        "no-ping",  # Rackboot's node in the netboot test probes nothing either
        "dhcp-userclass=set:ipxe,iPXE",
        # Option 60 "PXEClient" back to a PXE client, as Rackboot answers: iPXE then takes
        # the offer as its ProxyDHCP offer too and requests at once. Without it iPXE waits
        # ~2-3 s for a ProxyDHCP offer (DHCPACK 5.4 s instead of 2.5 s, BIOS, measured).
        "dhcp-vendorclass=set:pxe,PXEClient",
        "dhcp-option-force=tag:pxe,60,PXEClient",
        # RA only (no DHCPv6: M and O clear), router lifetime 0, every 10 s unsolicited.
        "enable-ra",
        f"dhcp-range={PEER_PREFIX},ra-only,64",
        f"ra-param={srv.ifname},10,0",
    ]
    if firmware == "bios":
        lines += ["enable-tftp", f"tftp-root={tftp_root}", "dhcp-boot=tag:ipxe,boot.ipxe"]
    else:
        lines += [
            # OVMF's HTTP boot: vendor class HTTPClient back, and the URL of ipxe.efi.
            "dhcp-vendorclass=set:httpclient,HTTPClient:Arch:00016",
            "dhcp-option-force=tag:httpclient,60,HTTPClient",
            f"dhcp-boot=tag:httpclient,tag:!ipxe,{http}/ipxe.efi",
            # iPXE expands settings in the filename it is given: the per-MAC script.
            f"dhcp-boot=tag:ipxe,{http}/${{net0/mac:hexhyp}}.ipxe",
        ]
    return "\n".join(lines) + "\n"


def nginx_conf(addr: str, http_root: Path, work: Path) -> str:
    return (
        f"user root; daemon off; worker_processes 1; pid {work}/nginx.pid;\n"
        f"error_log {work}/nginx-error.log;\n"
        "events { worker_connections 1024; }\n"
        "http {\n  sendfile on; tcp_nopush on;\n"
        f"  log_format bench '{timings.NGINX_LOG_FORMAT}';\n"
        f"  access_log {work}/nginx-access.log bench;\n"
        f"  server {{ listen {addr}:80;\n"
        f"    location /boot/ {{ alias {http_root}/; }}\n"
        # The events POST: a fixed answer, as Rackboot's 201 (nginx keeps nothing).
        "    location /api/ { return 201 '{\"ok\": true}'; }\n"
        "  }\n}\n"
    )


def _ip(host: Host, *args: str) -> None:
    res = host.run(["ip", *args], timeout=10)
    if res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} in {host.ns}: {res.stderr.strip()}")


def _wait_link_local(host: Host) -> None:
    """dnsmasq sends advertisements from the link-local address: wait for its DAD."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        out = host.run(["ip", "-6", "addr", "show", "dev", host.ifname], timeout=10).stdout
        if "fe80:" in out and "tentative" not in out:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no usable link-local address on {host.ifname}: {out}")
        time.sleep(0.1)
