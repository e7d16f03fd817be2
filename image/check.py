"""Boot the built image in QEMU and put it through its paces (not in CI: minutes).

    flock -s /tmp/rackboot-bench.lock python -m image.check --out DIR

DIR is image.build's output, built with ``--root-password rackboot``. UEFI
(OVMF): the first boot shows the setup dialog on the serial console; it is
answered (a standalone appliance serving DHCP on its one NIC); root logs in;
a bundle whose health hook fails is installed: the appliance boots slot B,
the check fails, it marks B bad and reboots into A by itself; then a good
bundle: B boots and is marked good. BIOS (SeaBIOS): GRUB boots slot A and the
setup dialog appears. Each VM writes to a snapshot of DIR/disk.img (QEMU's, kept across reboots);
the bundles are served to the VM from 127.0.0.1 (QEMU's user network maps
10.0.2.2 to the host's loopback). Every wait has a deadline.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import pexpect

from appliance.firmware.keys import load_private, write_bundle
from image.build import squashfs

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
PASSWORD = "rackboot"
PROMPT = "root@rackboot:~# "
FAILING_HOOK = "usr/lib/rackboot/health.d/50-demo-fails"
BOOT = 600  # seconds a boot may take under TCG


def log(text: str) -> None:
    print(f"image.check: {text}", file=sys.stderr, flush=True)


def bundles(out: Path) -> dict[str, Path]:
    """1.1: the image's own root, signed as 1.1. 1.2: the same with a health hook
    that fails, so the appliance must roll back."""
    key = load_private(out / "release-key.pem")
    made = {}
    for version, extra in (
        ("1.1", None),
        ("1.2", {FAILING_HOOK: "#!/bin/sh\necho demo\nexit 1\n"}),
    ):
        rootfs = squashfs(out / "root", out / f"rootfs-{version}.squashfs", extra)
        files = {"rootfs": rootfs, "kernel": out / "vmlinuz", "initrd": out / "initrd.img"}
        made[version] = out / f"rackboot-{version}.bundle"
        write_bundle(made[version], files, version=version, board="x86_64", key=key)
    return made


def serve(directory: Path) -> int:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


class Vm:
    def __init__(self, out: Path, firmware: str, accel: str) -> None:
        self.work = out / f"vm-{firmware}"
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir()
        argv = ["qemu-system-x86_64", "-accel", accel, "-m", "2048", "-smp", "2",
                "-display", "none", "-serial", "stdio", "-monitor", "none",
                # snapshot: writes stay in QEMU (across the guest's reboots), not the image
                "-drive", f"file={out / 'disk.img'},format=raw,if=virtio,snapshot=on",
                "-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0"]  # fmt: skip
        if firmware == "uefi":
            shutil.copyfile(OVMF_VARS, self.work / "vars.fd")
            argv += ["-drive", f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
                     "-drive", f"if=pflash,format=raw,file={self.work / 'vars.fd'}"]  # fmt: skip
        self.console = open(self.work / "console.log", "w", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed by stop)
        self.child = pexpect.spawn(argv[0], argv[1:], encoding="utf-8", codec_errors="replace",
                                   timeout=BOOT, logfile=self.console)  # fmt: skip

    def expect(self, pattern: str, timeout: float = BOOT) -> str:
        self.child.expect(pattern, timeout=timeout)
        return self.child.match.group(0) if hasattr(self.child.match, "group") else ""

    def answer(self, prompt: str, text: str) -> None:
        self.child.expect_exact(prompt, timeout=BOOT)
        self.child.sendline(text)

    def shell(self, command: str, timeout: float = 120) -> str:
        self.child.sendline(command)
        self.child.expect_exact(PROMPT, timeout=timeout)
        return self.child.before

    def login(self) -> None:
        """Root on the console. A prompt already on the screen may belong to a system
        that is going down (a verdict's reboot): ask again until one answers."""
        deadline = time.monotonic() + BOOT
        while time.monotonic() < deadline:
            self.child.sendline("")
            try:
                self.child.expect_exact("rackboot login: ", timeout=30)
                self.child.sendline("root")
                self.child.expect_exact("Password: ", timeout=30)
                self.child.sendline(PASSWORD)
                self.child.expect_exact(PROMPT, timeout=60)
                return
            except pexpect.TIMEOUT:
                continue
        raise TimeoutError("no login on the serial console")

    def stop(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
        self.console.close()


def setup_dialog(vm: Vm) -> None:
    """Answer the dialog: a standalone appliance serving DHCP on its one NIC."""
    vm.expect(r"Name of this appliance \[")
    listing = vm.child.before
    nic = re.findall(r"^(en\w+|eth\d+)\s", listing, re.M)
    vm.child.sendline("rb-demo")
    vm.answer("Rack it serves: ", "r1")
    vm.answer("Management address (other appliances reach this one here): ", "10.0.2.15")
    vm.answer("Provisioning interface(s), comma-separated: ", nic[0] if nic else "ens3")
    vm.expect(r"Subnet on \S+ \(CIDR\): ")
    vm.child.sendline("10.0.2.0/24")
    vm.expect(r"DHCP pool\(s\) in 10.0.2.0/24, 'first-last': ")
    vm.child.sendline("10.0.2.100-10.0.2.199")
    vm.expect(r"Router for machines on 10.0.2.0/24 \('none'\) \[none\]: ")
    vm.child.sendline("none")
    vm.expect(r"The rack's virtual IP \(held by the active appliance; 'none'\): ")
    vm.child.sendline("none")
    vm.expect(r"Cluster: 'new' to create one, 'join' to paste a join token \[new\]: ")
    vm.child.sendline("new")
    vm.expect(r"Write it to /etc/rackboot/rackboot.toml\? \[y/n\]: ")
    vm.child.sendline("y")


def update(vm: Vm, port: int, version: str) -> None:
    vm.shell("mountpoint -q /mnt || mount -t tmpfs -o size=1200m tmpfs /mnt")
    vm.shell(f"python3 -c \"import urllib.request as u; u.urlretrieve("
             f"'http://10.0.2.2:{port}/rackboot-{version}.bundle', '/mnt/b')\"", timeout=600)  # fmt: skip
    vm.child.sendline("rackboot firmware update /mnt/b")
    vm.child.expect_exact("it boots next, on trial", timeout=600)


def check_uefi(out: Path, port: int, accel: str) -> None:
    vm = Vm(out, "uefi", accel)
    try:
        t0 = time.monotonic()
        setup_dialog(vm)
        log(f"UEFI: setup dialog answered ({time.monotonic() - t0:.0f} s after power-on)")
        vm.login()
        vm.shell(
            "printf '\\n[firmware]\\nhealth_timeout = 150.0\\n' >> /etc/rackboot/rackboot.toml"
        )
        assert "booted slot a" in vm.shell("rackboot firmware status")
        update(vm, port, "1.2")
        vm.child.expect_exact("slot b marked bad", timeout=BOOT)
        log("UEFI: slot b (1.2, failing health hook) booted, failed its check, marked bad")
        vm.login()
        status = vm.shell("rackboot firmware status")
        assert "booted slot a" in status and re.search(r"slot b: bad", status), status
        log("UEFI: rolled back to slot a by itself")
        update(vm, port, "1.1")
        vm.child.expect_exact("slot b marked good", timeout=BOOT)
        vm.login()
        status = vm.shell("rackboot firmware status")
        assert "booted slot b  version 1.1" in status and "slot b: good" in status, status
        log("UEFI: slot b (1.1) booted, passed its health check, marked good")
    finally:
        vm.stop()


def check_bios(out: Path, accel: str) -> None:
    vm = Vm(out, "bios", accel)
    try:
        vm.expect(r"Rackboot: slot a ")
        vm.expect(r"Name of this appliance \[")
        log("BIOS: GRUB booted slot a; the setup dialog is on the serial console")
    finally:
        vm.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m image.check", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="image.build's output directory")
    p.add_argument("--firmware", choices=("uefi", "bios", "both"), default="both")
    p.add_argument("--accel", choices=("tcg", "kvm"), default="tcg")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    started = time.monotonic()
    if args.firmware in ("bios", "both"):
        check_bios(out, args.accel)
    if args.firmware in ("uefi", "both"):
        port = serve(out)
        bundles(out)
        check_uefi(out, port, args.accel)
    log(f"all checks passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
