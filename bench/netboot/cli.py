"""``python -m bench.netboot``: power-on to ``installed``, Rackboot vs dnsmasq + nginx, same run.

What runs
---------
Per firmware (``--firmware bios,uefi``) two labs (``tests/support/netns.py``), one
link per side, both up for the whole firmware's turn:

* **rackboot**: ``rackboot run`` (``tests.support.netboot.node.NetbootNode``) with
  DHCP, TFTP, HTTP boot, the events API and the ``ra`` plugin (on by default),
  configured as ``tests/real/test_netboot.py``: BIOS gets ``[dhcp.boot] ipxe_script =
  "boot.ipxe"`` (TFTP script, then HTTP), UEFI the boot table's defaults
  (``http_x64`` = ``/boot/ipxe.efi``, then ``ipxe_script`` = ``/boot/{mac}.ipxe``).
  No VM is powered on before the plugin says it is answering.
* **dnsmasq+nginx**: dnsmasq with the same pool and the same boot answers (user class
  ``iPXE`` -> ``boot.ipxe`` by TFTP for BIOS; vendor class ``HTTPClient`` ->
  ``http://SRV/boot/ipxe.efi`` with option 60 ``HTTPClient``, then user class ``iPXE``
  -> ``http://SRV/boot/${net0/mac:hexhyp}.ipxe``, which iPXE expands, for UEFI), option
  60 ``PXEClient`` to PXE clients as Rackboot sends it (without it iPXE waits ~2-3 s
  for a ProxyDHCP offer: DHCPACK at 5.4 s instead of 2.5 s, BIOS), and
  router advertisements: ``enable-ra``, ``dhcp-range=fd72:6b62:6e62::,ra-only,64``
  (dnsmasq advertises only a prefix it has an address in; ``ra-only`` leaves M and O
  clear so iPXE finishes at once, as with Rackboot's RA) and ``ra-param=IF,10,0``
  (router lifetime 0, like the ``ra`` plugin). nginx (``worker_processes 1``,
  ``sendfile on``) serves the same files, per machine a static copy of the script
  Rackboot renders (its own renderer, a fixed token), and answers the installer's
  POST to ``/api/`` with a fixed ``201`` (``return``).

The installer is appliance/lab's (Debian's cloud kernel, a busybox initrd
that posts ``installed`` and powers off). Every boot is a new MAC to both servers.
The VMs run QEMU (``appliance.lab.vm``) under TCG by default (``--accel kvm``
to try KVM; docs/netboot-test.md says why TCG).

What is measured (seconds from QEMU's start = power-on)
-------------------------------------------------------
* ``DHCPACK``: the first ACK to the VM's MAC, from a sniffer on the server's link.
* ``iPXE configured``: iPXE's ``Configuring (net0 ...)... ok`` on the serial console
  (DHCP and IPv6 both done: shows whether the router advertisement arrived).
* ``script sent``, ``kernel sent``: the server's access-log line for the VM's
  ``GET /boot/MAC.ipxe`` and ``GET /boot/vmlinuz`` (both servers log once the answer
  is sent; Rackboot's ``ts=`` has ms, nginx's ``$msec`` too), matched to the VM by the
  addresses DHCP gave its MAC.
* ``installed (console)``: the installer's ``RACKBOOT-INSTALLER: event posted`` line
  (after the POST was answered), the VM's own account.
* ``event answered``: the server's access-log line for the POST. For Rackboot the
  event it recorded (machine record, stage ``installed``) is checked and its time
  printed as ``recorded``.

Below the timeline, each server's own time for this VM: ``DHCP answers (sum)``, the
sniffer's time from each DISCOVER or REQUEST to the server's answer, summed over the
boot's exchanges (iPXE's, and the installer's udhcpc; UEFI: OVMF's too);
``script request`` and ``kernel request``, what the access log says the request took
(Rackboot's ``ms=``, nginx's ``$request_time``, which has millisecond resolution).
The timeline is mostly the firmware's and the guest's; these are the servers'.

Console lines are stamped when read (every 20 ms). Each stage is the median of
``--repeats`` boots (default 3), the sides alternating order; ``ratio`` is Rackboot's
median over the peer's (<= 1.00: no slower).

**Scale** (``--vms N``, firmware ``--scale-firmware``): N VMs powered on together
(within ~0.1 s) on one side, then on the other; the time from the first power-on
to the last ``installed`` on a console and to the last event answered, and the
median per VM. Under TCG the VMs share the 2 vCPUs with both servers.

While the run goes on, the CPU time of processes outside the labs is added up and
printed (another session's load slows the VMs of both sides alike, but not
equally if it comes and goes). ``--json`` saves ``bench/results/netboot-STAMP.json``.

Commands::

    sudo .venv/bin/python -m bench.netboot                         # both firmwares, 3 repeats, scale
    sudo .venv/bin/python -m bench.netboot --firmware bios --repeats 1 --vms 0   # a smoke run
    sudo .venv/bin/python -m bench.netboot --vms 8 --scale-firmware bios,uefi --json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from appliance.lab import debs, initrd, vm
from bench import results_file
from bench.dhcp.system import OtherCPU, cpu_model, missing_packages
from bench.netboot import timings
from bench.netboot.boots import VmLink, boot, mac_of
from bench.netboot.servers import Files, PeerSide, RackbootSide
from bench.tftp.servers import apt
from tests.support.netns import Lab

PACKAGES = ["qemu-system-x86", "ipxe-qemu", "ovmf", "ipxe", "dnsmasq-base", "nginx-light",
            "curl", "iproute2"]  # fmt: skip
CACHE = Path("/var/cache/rackboot-bench/netboot")  # the unpacked kernel and busybox .debs
IPXE_EFI = Path("/usr/lib/ipxe/ipxe.efi")
DEFAULT_VMS = 8  # TCG on 2 vCPUs: ~41-44 s to the last installed (single boot ~9 s)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.netboot", description=__doc__.splitlines()[0])
    p.add_argument("--firmware", default="bios,uefi", help="single-VM boots: bios,uefi")
    p.add_argument("--repeats", type=int, default=3, help="single-VM boots per side (3)")
    p.add_argument("--vms", type=int, default=DEFAULT_VMS,
                   help=f"VMs booting at once in the scale scenario, 0 for none ({DEFAULT_VMS})")  # fmt: skip
    p.add_argument("--scale-firmware", default="bios", help="firmwares of the scale scenario")
    p.add_argument("--accel", choices=("tcg", "kvm"), default="tcg", help="QEMU accelerator")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a boot (or group) may take"
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, consoles)")
    p.add_argument("--json", nargs="?", const="", default=None, help="save to bench/results/")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.netboot must run as root (namespaces, taps, apt-get)", file=sys.stderr)
        return 2
    missing = missing_packages(PACKAGES)
    if missing and apt("install", "-y", "--no-install-recommends", *missing).returncode != 0:
        apt("update")
        apt("install", "-y", "--no-install-recommends", *missing)
    if reason := vm.missing():
        print(f"bench.netboot: {reason}", file=sys.stderr)
        return 2
    if args.accel == "kvm":
        os.environ[vm.ACCEL_ENV] = "kvm"
    accel, why = vm.accelerator()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    work = Path(tempfile.mkdtemp(prefix="rackboot-bench-netboot-"))
    os.chmod(work, 0o755)  # dnsmasq reads its TFTP root as nobody
    kernel = debs.kernel(CACHE)
    files = Files(kernel.image, initrd.build(kernel, debs.busybox(CACHE), work / "initrd.img"),
                  IPXE_EFI)  # fmt: skip
    print(f"bench.netboot {stamp}: median of {args.repeats} boots per side and firmware, "
          f"scale {args.vms} VMs ({args.scale_firmware})")  # fmt: skip
    print(f"env: cpu={cpu_model()} vcpus={os.cpu_count()} accel={accel} ({why}) "
          f"kernel={kernel.version} load={_load()} work={work}")  # fmt: skip
    results: dict = {"accel": accel, "kernel": kernel.version, "load_before": os.getloadavg()}
    counter = iter(range(1 << 16))
    try:
        for firmware in [f for f in args.firmware.split(",") if f]:
            scale = args.vms if firmware in args.scale_firmware.split(",") else 0
            results[firmware] = run_firmware(firmware, args, scale, accel, files,
                                             work / firmware, counter)  # fmt: skip
        scale_only = [f for f in args.scale_firmware.split(",")
                      if f and args.vms and f not in args.firmware.split(",")]  # fmt: skip
        for firmware in scale_only:
            results[firmware] = run_firmware(firmware, args, args.vms, accel, files,
                                             work / firmware, counter, repeats=0)  # fmt: skip
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    results["load_after"] = os.getloadavg()
    print(f"load average after: {_load()}")
    if args.json is not None:
        results_file.save("netboot", stamp, args.json, vars(args), results)
    return 0


def run_firmware(firmware: str, args: argparse.Namespace, scale: int, accel: str, files: Files,
                 work: Path, counter, repeats: int | None = None) -> dict:  # fmt: skip
    """Both sides up on their own links; the single boots alternating, then the scale run."""
    repeats = args.repeats if repeats is None else repeats
    out: dict = {"boots": {}, "medians": {}, "scale": {}}
    with Lab(prefix="rbn") as lab_r, Lab(prefix="rbp", avoid=(lab_r,)) as lab_p:
        sides = [RackbootSide(lab_r, work / "rackboot", firmware, files),
                 PeerSide(lab_p, work / "peer", firmware, files)]  # fmt: skip
        links = {}
        for side in sides:
            side.start()
            links[side.name] = VmLink(side.lab)
            out["boots"][side.name] = []
        others = OtherCPU([*lab_r.namespaces, *lab_p.namespaces])
        others.start()
        for i in range(repeats):
            for side in sides if i % 2 == 0 else sides[::-1]:
                mac = mac_of(next(counter))
                (record,), cpu = boot(side, links[side.name], side.work / f"boot{i}",
                                      firmware, [mac], accel, args.timeout)  # fmt: skip
                row = {**_row(side, record), "server_cpu_s": cpu}
                out["boots"][side.name].append(row)
                print(f"{firmware} {side.name:<14} #{i + 1} {mac}: {_line(row)}")
        if repeats:
            for side in sides:
                out["medians"][side.name] = timings.medians(out["boots"][side.name])
            ours, peer = (out["medians"][s.name] for s in sides)
            keys = [k for k, _ in (*timings.STAGES, *timings.SERVER_TIMES)]
            out["ratio"] = {k: timings.ratio(ours[k], peer[k]) for k in keys}
            print(timings.ratio_table(f"{firmware} ({accel}), median of {repeats}", ours, peer))
        if scale:
            for side in sides:
                macs = [mac_of(next(counter)) for _ in range(scale)]
                records, cpu = boot(side, links[side.name], side.work / "scale", firmware,
                               macs, accel, args.timeout)  # fmt: skip
                rows = [_row(side, r) for r in records]
                summary: dict = timings.scale_summary(rows, min(r.powered_on for r in records),
                                                [r.powered_on for r in records])  # fmt: skip
                summary["server_cpu_s"] = cpu
                out["scale"][side.name] = {**summary, "vms_detail": rows}
                print(f"{firmware} scale {side.name:<14} {scale} VMs: {_scale_line(summary)}")
            ours, peer = (out["scale"][s.name]["last_installed_s"] for s in sides)
            out["scale"]["ratio_last_installed"] = timings.ratio(ours, peer)
            print(f"{firmware} scale ratio (last installed): {_fmt(timings.ratio(ours, peer))}x")
        busy, hogs = others.stop()
        out["others_cpu_pct"] = round(busy, 1)
        print(f"{firmware}: other processes meanwhile {busy:.0f}% of a CPU {hogs or ''}")
    return out


def _row(side, record: timings.BootRecord) -> dict:
    row: dict = {"mac": record.mac, **timings.stages(record)}
    if failed := timings.failure(record):
        row["failed"] = failed
    if side.name == "rackboot":
        event = side.recorded_event(record.mac)
        row["recorded"] = None if event is None else round(event["time"] - record.powered_on, 3)
    return row


def _line(row: dict) -> str:
    parts = [f"{key} {_fmt(row.get(key))}" for key, _ in (*timings.STAGES, *timings.SERVER_TIMES)]
    parts.append(f"server CPU {_fmt(row.get('server_cpu_s'))} s")
    if "recorded" in row:
        parts.append(f"recorded {_fmt(row['recorded'])}")
    if "failed" in row:
        parts.append(f"FAILED: {row['failed']}")
    return ", ".join(parts)


def _scale_line(summary: dict) -> str:
    return (f"{summary['installed']}/{summary['vms']} installed, last at "
            f"{_fmt(summary['last_installed_s'])} s (last event {_fmt(summary['last_event_s'])} s), "
            f"median per VM {_fmt(summary['median_installed_s'])} s, "
            f"powered on within {_fmt(summary['power_on_spread_s'])} s, "
            f"server CPU {_fmt(summary.get('server_cpu_s'))} s")  # fmt: skip


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
