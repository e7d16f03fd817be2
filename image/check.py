"""Boot the built image in QEMU and put it through its paces (not in CI: minutes).

    flock -s /tmp/rackboot-bench.lock python -m image.check --out DIR

DIR is image.build's output, built with ``--root-password rackboot``. UEFI
(OVMF): the first boot shows the setup dialog on the serial console; it is
answered (a standalone appliance: its one NIC for management and provisioning,
with static addresses); root logs in;
a bundle whose node exits at start is installed: the appliance boots slot B,
the check fails at once, it marks B bad and reboots into A by itself; then a good
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
import sys
import threading
import time
from pathlib import Path

from appliance.firmware.keys import load_private, write_bundle
from image.build import squashfs
from image.serialvm import BOOT, Setup, Vm, setup_dialog, wait_for_dialog

# 1.2: a release whose node exits at start (a drop-in replacing its command), which
# its health check judges at once (docs/updates.md: a definite failure).
BROKEN = {
    "usr/lib/systemd/system/rackboot.service.d/50-demo-exits.conf": (
        "[Service]\nExecStart=\nExecStart=/bin/sh -c 'echo demo: 1.2 exits at start; exit 1'\n"
    )
}
MAC = "52:54:00:72:62:01"
# One NIC on QEMU's user network (10.0.2.0/24, the host's loopback at 10.0.2.2): the
# management address and the provisioning subnet on the same interface.
SETUP = Setup(management_mac=MAC, management="10.0.2.15/24", gateway="10.0.2.2",
              provisioning_mac=MAC, subnet="10.0.2.0/24", address="10.0.2.15",
              pool="10.0.2.100-10.0.2.199")  # fmt: skip


def log(text: str) -> None:
    print(f"image.check: {text}", file=sys.stderr, flush=True)


def bundles(out: Path) -> dict[str, Path]:
    """1.1: the image's own root, signed as 1.1. 1.2: the same with a node that
    exits at start, so the appliance must roll back."""
    key = load_private(out / "release-key.pem")
    made = {}
    for version, extra in (("1.1", None), ("1.2", BROKEN)):
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


def boot(out: Path, firmware: str, accel: str) -> Vm:
    return Vm(out / "disk.img", out / f"vm-{firmware}", firmware=firmware, accel=accel,
              nics=[("user", MAC)])  # fmt: skip


def update(vm: Vm, port: int, version: str) -> None:
    vm.shell("mountpoint -q /mnt || mount -t tmpfs -o size=1200m tmpfs /mnt")
    vm.shell(f"python3 -c \"import urllib.request as u; u.urlretrieve("
             f"'http://10.0.2.2:{port}/rackboot-{version}.bundle', '/mnt/b')\"", timeout=600)  # fmt: skip
    vm.child.sendline("rackboot firmware update /mnt/b")
    vm.child.expect_exact("it boots next, on trial", timeout=600)


def check_uefi(out: Path, port: int, accel: str) -> None:
    vm = boot(out, "uefi", accel)
    try:
        setup_dialog(vm, SETUP, wait_for_dialog(vm))
        log(f"UEFI: setup dialog answered ({vm.since_start():.0f} s after power-on)")
        vm.login()
        vm.shell(
            "printf '\\n[firmware]\\nhealth_timeout = 150.0\\n' >> /etc/rackboot/rackboot.toml"
        )
        assert "booted slot a" in vm.shell("rackboot firmware status")
        update(vm, port, "1.2")
        rebooting = vm.since_start()
        vm.expect(r"unhealthy \(for good: not waiting\): [^\r\n]*\r", timeout=BOOT)
        log(f"UEFI: {vm.child.match.group(0).strip()}")
        vm.child.expect_exact("slot b marked bad", timeout=BOOT)
        log(f"UEFI: slot b (1.2, its node exits at start) marked bad "
            f"{vm.since_start() - rebooting:.0f} s after the reboot into it")  # fmt: skip
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
    vm = boot(out, "bios", accel)
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
