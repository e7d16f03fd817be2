"""``rackboot lab``'s command line (docs/lab.md, docs/cli.md). Only argparse here: the
lab's modules are imported when the command runs, so ``rackboot --help`` stays quick."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_lab_command(sub: argparse._SubParsersAction) -> None:
    lab = sub.add_parser(
        "lab",
        help="a virtual rack in network namespaces: two appliances, a witness and a VM "
        "that netboots; the active killed, the VM boots again from the standby (root)",
    )
    lab.add_argument(
        "--once", action="store_true",
        help="build, boot, fail over, boot again, tear down; exit 0 only if both boots "
        "reached installed (without it the rack keeps running until Ctrl-C)",
    )  # fmt: skip
    lab.add_argument(
        "--workdir", metavar="DIR", type=Path,
        help="configurations, data and logs (default: a new /tmp/rackboot-lab-* directory, "
        "removed at the end unless the lab failed)",
    )  # fmt: skip
    lab.add_argument(
        "--cache", metavar="DIR", type=Path,
        help="the VM's kernel and busybox, fetched once (default ~/.cache/rackboot/lab)",
    )  # fmt: skip
    lab.add_argument(
        "--accel", choices=("tcg", "kvm"), default="tcg",
        help="QEMU's accelerator (default tcg; kvm falls back to tcg, saying why, when "
        "/dev/kvm cannot create a VM)",
    )  # fmt: skip
    lab.add_argument(
        "--no-install", dest="install", action="store_false",
        help="do not apt-get install missing programs (qemu, iPXE's ROM): name them, exit 8",
    )  # fmt: skip
    lab.add_argument(
        "--boot-timeout", metavar="SECONDS", type=float, default=300.0,
        help="how long each boot may take to reach installed (default 300)",
    )  # fmt: skip
    lab.set_defaults(func=cmd_lab)


def cmd_lab(args: argparse.Namespace) -> int:
    from appliance.errors import UsageError
    from appliance.lab.run import Options, run_lab

    if not 10 <= args.boot_timeout <= 3600:
        raise UsageError(f"--boot-timeout wants seconds from 10 to 3600, got {args.boot_timeout:g}")
    options = Options(args.once, args.workdir, args.cache, args.accel, args.install,
                      args.boot_timeout)  # fmt: skip
    return run_lab(options)
