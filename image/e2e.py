"""The appliance image from build to a netbooted machine (root; not in CI: minutes).

    flock -s /tmp/rackboot-bench.lock python -m image.e2e --out DIR [--reuse]

Builds the image (image.build, with the console's test password; ``--reuse`` boots
DIR/disk.img as it is), then in a network namespace made for the run:

1. boots it in QEMU (UEFI) with two NICs: management on QEMU's user network, where
   10.0.2.2 is the namespace's loopback; provisioning on a tap bridged to a second
   VM's, the rack's link;
2. answers the setup dialog on the serial console: static management address and
   gateway, the provisioning interface's address, subnet and pool, a new cluster;
3. checks the addresses are set (systemd-networkd, from setup's files on the data
   partition); as an operator would, gives the node a boot profile, the VM as a
   machine to provision, and the VM's kernel and installer (Debian's cloud kernel
   and the busybox installer of appliance/lab, fetched with apt-get download);
4. reboots it and checks the addresses are back: they persist; an address added
   by hand, as the node adds the rack's VIP, outlives systemd-networkd
   configuring the link again;
5. provisions the machine and powers on the second VM (BIOS, QEMU's iPXE ROM): DHCP,
   the HTTP boot script, the kernel, the installer, which posts ``installed``.

Exit 0 only when the second VM's installer reached ``installed`` and the appliance's
record of the machine says ``provisioned``. Each step's time is printed. Everything
started is stopped by its PID and the namespaces removed, whatever happens.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path

from appliance.lab import debs, initrd, leftovers, vm
from appliance.lab.boot import boot_sections
from appliance.lab.netns import Lab, LabError, need_root
from appliance.lab.run import default_cache
from image import build
from image.serialvm import PASSWORD, Setup, Vm, setup_dialog, wait_for_dialog

MANAGEMENT_MAC = "52:54:00:72:62:01"
PROVISIONING_MAC = "52:54:00:72:62:02"
MACHINE, MACHINE_MAC = "vm1", "52:54:00:72:62:10"
FILES_PORT = 8000  # the namespace's loopback: 10.0.2.2 from the appliance's management NIC
HTTP_ROOT = "/srv/rackboot/http"  # the image's default roots, on the data partition
TFTP_ROOT = "/srv/rackboot/tftp"
NETBOOT_TIMEOUT = 600.0  # the second VM: DHCP, iPXE, kernel, installer under TCG


def log(text: str) -> None:
    print(f"image.e2e: {text}", file=sys.stderr, flush=True)


class Step:
    """Prints each step's duration and keeps them for the summary."""

    def __init__(self) -> None:
        self.started = self.last = time.monotonic()
        self.times: list[tuple[str, float]] = []

    def done(self, what: str) -> None:
        now = time.monotonic()
        self.times.append((what, now - self.last))
        log(f"{what}: {now - self.last:.0f} s (total {now - self.started:.0f} s)")
        self.last = now


def node_settings() -> str:
    """What the operator adds after setup: the boot profile and the machine to provision."""
    machine = (f'\n[[provisioning.machines]]\nname = "{MACHINE}"\n'
               f'macs = ["{MACHINE_MAC}"]\n')  # fmt: skip
    return "\n" + boot_sections(HTTP_ROOT, TFTP_ROOT) + machine


def check_addresses(appliance: Vm, expected: dict[str, str], gateway: str) -> None:
    shown = appliance.output("ip -4 -o addr show; ip -4 route show default")
    for interface, address in expected.items():
        if not any(interface in line and f" {address} " in line for line in shown.splitlines()):
            raise LabError(f"{interface} lacks {address}:\n{shown}")
    if f"default via {gateway} " not in shown:
        raise LabError(f"no default route via {gateway}:\n{shown}")


def addresses(names: dict[str, str], setup: Setup, prefix: int) -> dict[str, str]:
    """What each interface must carry: interface -> address/prefix."""
    return {names[MANAGEMENT_MAC]: setup.management,
            names[PROVISIONING_MAC]: f"{setup.address}/{prefix}"}  # fmt: skip


def first_boot(appliance: Vm, setup: Setup, prefix: int, steps: Step) -> dict[str, str]:
    """The dialog, then the settings and files an operator adds; the addresses set.
    Returns the interface names by MAC."""
    names = wait_for_dialog(appliance)
    steps.done("appliance: power-on to the setup dialog")
    setup_dialog(appliance, setup, names)
    appliance.expect(r"The network: systemd-networkd reloaded; [^\r\n]*\r")
    log(appliance.child.match.group(0).strip())
    appliance.expect(r"Done: systemctl (re)?start rackboot")
    steps.done("setup dialog answered, addresses set, service started")
    expected = addresses(names, setup, prefix)
    appliance.login()
    check_addresses(appliance, expected, setup.gateway)
    settings = base64.b64encode(node_settings().encode()).decode()
    appliance.shell(f"echo {settings} | base64 -d >> /etc/rackboot/rackboot.toml")
    fetch = "; ".join(
        f"u.urlretrieve('http://10.0.2.2:{FILES_PORT}/{name}', '{HTTP_ROOT}/{name}')"
        for name in ("vmlinuz", "initrd.img")
    )
    appliance.shell(f'python3 -c "import urllib.request as u; {fetch}"', timeout=300)
    check = appliance.output("rackboot config check /etc/rackboot/rackboot.toml")
    if ": ok" not in check:
        raise LabError(f"the configuration with the boot settings: {check}")
    steps.done("operator: boot profile, machine, kernel and installer added")
    return names


def python_field(command: str, expression: str) -> str:
    """A shell line printing ``FIELD=<expression on command's JSON output>``."""
    return (f"{command} --json | python3 -c \"import json, sys; d = json.load(sys.stdin); "
            f"print('FIELD=' + str({expression}))\"")  # fmt: skip


def after_reboot(appliance: Vm, expected: dict[str, str], gateway: str, steps: Step) -> None:
    appliance.child.sendline("reboot")
    appliance.expect(r"rackboot login: ")
    appliance.login()
    check_addresses(appliance, expected, gateway)
    link = appliance.output("readlink -f /etc/systemd/network").strip()
    if link != "/data/etc/rackboot/network":
        raise LabError(f"/etc/systemd/network resolves to {link!r}, not the data partition")
    deadline = time.monotonic() + 120
    ready = python_field("rackboot status", "d['core']['ready']")
    while "FIELD=True" not in appliance.output(ready):
        if time.monotonic() > deadline:
            raise LabError("the node is not ready 120 s after the reboot")
        time.sleep(2)
    steps.done("appliance rebooted: the same addresses, the node ready")


def foreign_address_kept(appliance: Vm, interface: str, address: str) -> None:
    """An address the node adds itself (the rack's VIP) outlives systemd-networkd
    configuring the provisioning link again (setup's KeepConfiguration=static)."""
    appliance.shell(f"ip addr add {address} dev {interface} && networkctl reconfigure {interface}")
    deadline = time.monotonic() + 30
    while "configured" not in appliance.output(f"networkctl list --no-legend {interface}"):
        if time.monotonic() > deadline:
            raise LabError(f"{interface} not configured again within 30 s")
        time.sleep(1)
    shown = appliance.output(f"ip -4 -o addr show dev {interface}")
    if f" {address} " not in shown:
        raise LabError(f"{address} on {interface} dropped by systemd-networkd:\n{shown}")
    appliance.shell(f"ip addr del {address} dev {interface}")


def netboot(appliance: Vm, client: vm.Vm, steps: Step) -> None:
    said = appliance.output(f"rackboot machines reprovision {MACHINE}")
    if "requested" not in said:
        raise LabError(f"machines reprovision {MACHINE}: {said}")
    client.start()
    _, line = client.wait_for(rf"{initrd.MARK} (installed|FAILED)", NETBOOT_TIMEOUT)
    if "FAILED" in line:
        raise LabError(f"the second VM's installer: {line}\n{client.console.text()}")
    steps.done(f"second VM netbooted from the appliance to '{line}'")
    state = appliance.output(python_field(f"rackboot machines show {MACHINE}", "d['state']"))
    if "FIELD=provisioned" not in state:
        raise LabError(f"the appliance's record of {MACHINE}: {state}")
    log(f"the appliance's record of {MACHINE}: state provisioned")


def run(out: Path, accel: str, cache: Path) -> Step:
    steps = Step()
    files = out / "e2e-files"
    files.mkdir(parents=True, exist_ok=True)
    kernel = debs.kernel(cache)
    (files / "vmlinuz").write_bytes(kernel.image.read_bytes())
    initrd.build(kernel, debs.busybox(cache), files / "initrd.img")
    steps.done(f"the second VM's kernel ({kernel.version}) and installer")
    lab = Lab(prefix="rbe2e")
    appliance = client = None
    try:
        host, (appliance_tap, client_tap) = vm.vms_host(lab, 2)
        host.popen([sys.executable, "-m", "http.server", str(FILES_PORT), "--bind", "127.0.0.1",
                    "--directory", str(files)], stdout=sys.stderr, stderr=sys.stderr)  # fmt: skip
        net = lab.network
        setup = Setup(management_mac=MANAGEMENT_MAC, management="10.0.2.15/24",
                      gateway="10.0.2.2", provisioning_mac=PROVISIONING_MAC, subnet=str(net),
                      address=str(net.network_address + 2),
                      pool=f"{net.network_address + 100}-{net.network_address + 150}",
                      name="rb-e2e")  # fmt: skip
        nics = [("user", MANAGEMENT_MAC),
                (f"tap,ifname={appliance_tap},script=no,downscript=no", PROVISIONING_MAC)]  # fmt: skip
        appliance = Vm(out / "disk.img", out / "e2e-appliance", firmware="uefi", accel=accel,
                       nics=nics, wrapper=("ip", "netns", "exec", host.ns))  # fmt: skip
        names = first_boot(appliance, setup, net.prefixlen, steps)
        after_reboot(appliance, addresses(names, setup, net.prefixlen), setup.gateway, steps)
        vip = f"{net.network_address + 200}/{net.prefixlen}"
        foreign_address_kept(appliance, names[PROVISIONING_MAC], vip)
        steps.done("a VIP-like address outlived networkctl reconfigure")
        client = vm.Vm(host, client_tap, out / "e2e-machine", firmware="bios",
                       mac=MACHINE_MAC, accel=accel)  # fmt: skip
        netboot(appliance, client, steps)
    finally:
        for one in (client, appliance):
            if one is not None:
                one.stop()
        for ns in lab.namespaces:
            leftovers.end_processes_in(ns)
        lab.close()
    return steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m image.e2e", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="image.build's output directory")
    p.add_argument("--reuse", action="store_true", help="boot DIR/disk.img as it is")
    p.add_argument("--accel", choices=("tcg", "kvm"), default="tcg")
    p.add_argument("--cache", type=Path, default=None, help="the second VM's packages")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    why = need_root() or vm.missing()
    if why:
        log(f"cannot run here: {why}")
        return 2
    started = time.monotonic()
    if not (args.reuse and (out / "disk.img").exists()):
        code = build.main(["--out", str(out), "--root-password", PASSWORD])
        if code:
            return code
        log(f"image built: {time.monotonic() - started:.0f} s")
    try:
        steps = run(out, args.accel, args.cache or default_cache())
    except KeyboardInterrupt:
        log("interrupted (everything it started is stopped)")
        return 130
    except (LabError, OSError, TimeoutError) as exc:
        log(f"FAILED: {exc}")
        return 1
    except Exception as exc:  # pexpect's TIMEOUT/EOF: say where, the consoles are kept
        log(f"FAILED: {type(exc).__name__}: {str(exc)[:2000]} (consoles in {out})")
        return 1
    log(f"passed in {time.monotonic() - started:.0f} s: "
        + ", ".join(f"{what} {seconds:.0f} s" for what, seconds in steps.times))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
