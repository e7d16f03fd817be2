"""`rackboot firmware ...` (docs/updates.md). Parsing imports nothing heavy: each
command imports the firmware modules (and cryptography) when it runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from appliance.errors import EXIT_FAILURE, EXIT_OK


def add_firmware_commands(sub: Any, with_config: Any) -> None:
    firmware = sub.add_parser("firmware", help="A/B firmware: status, update, health, release keys")
    actions = firmware.add_subparsers(dest="firmware_command", metavar="ACTION", required=True)
    status = with_config(actions.add_parser("status", help="the slots, their versions and state"))
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)
    update = with_config(
        actions.add_parser("update", help="write a signed bundle to the other slot, reboot into it")
    )
    update.add_argument("bundle", metavar="BUNDLE", type=Path)
    update.add_argument("--force", action="store_true", help="allow an older version")
    update.add_argument("--no-reboot", action="store_true", help="install only; reboot later")
    update.set_defaults(func=cmd_update)
    health = with_config(
        actions.add_parser("health", help="check this boot; mark a slot on trial good or bad")
    )
    health.add_argument("--timeout", type=float, help="seconds (default [firmware] health_timeout)")
    health.add_argument("--no-reboot", action="store_true", help="do not reboot after a failure")
    health.set_defaults(func=cmd_health)
    good = with_config(actions.add_parser("mark-good", help="mark the running slot good now"))
    good.set_defaults(func=cmd_mark_good)
    keygen = actions.add_parser("keygen", help="make a release key (build side)")
    keygen.add_argument("--out", metavar="FILE", type=Path, required=True, help="private key file")
    keygen.set_defaults(func=cmd_keygen)
    bundle = actions.add_parser("bundle", help="sign a slot image into a bundle (build side)")
    bundle.add_argument("--key", metavar="FILE", type=Path, required=True)
    bundle.add_argument("--version", required=True)
    bundle.add_argument("--board", default="x86_64")
    bundle.add_argument("--rootfs", metavar="FILE", type=Path, required=True)
    bundle.add_argument("--kernel", metavar="FILE", type=Path)
    bundle.add_argument("--initrd", metavar="FILE", type=Path)
    bundle.add_argument("--out", metavar="FILE", type=Path, required=True)
    bundle.set_defaults(func=cmd_bundle)


def firmware_of(args: argparse.Namespace):
    from appliance.firmware.manager import Firmware
    from appliance.firmware.schema import FIRMWARE
    from appliance.loader import resolve_source, section_settings

    return Firmware.from_settings(section_settings(resolve_source(args.config, args.dev), FIRMWARE))


def cmd_status(args: argparse.Namespace) -> int:
    status = firmware_of(args).status()
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return EXIT_OK
    print(f"booted slot {status['booted'] or '-'}  version {status['version'] or '-'}  "
          f"next boot {status['next_boot']}  loader {status['loader']}")  # fmt: skip
    for slot, info in status["slots"].items():
        print(f"  slot {slot}: {info['state']:<8}  version {info['version'] or '(unknown)'}  "
              f"entry {info['entry']}  {info['device']}")  # fmt: skip
    return EXIT_OK


def cmd_update(args: argparse.Namespace) -> int:
    firmware = firmware_of(args)
    slot = firmware.install(args.bundle, force=args.force)
    print(
        f"slot {slot} written and verified; it boots next, on trial until its health check passes"
    )
    if not args.no_reboot:
        firmware.reboot()
    return EXIT_OK


def cmd_health(args: argparse.Namespace) -> int:
    from appliance import control
    from appliance.firmware.health import (
        refused_configuration,
        service_gave_up,
        systemd_show,
        wait_healthy,
    )
    from appliance.firmware.schema import FIRMWARE
    from appliance.loader import node_settings, resolve_source, section_settings

    source = resolve_source(args.config, args.dev)
    settings = section_settings(source, FIRMWARE)
    node = node_settings(source)
    firmware = firmware_of(args)
    booted = firmware.booted()
    if booted is None or firmware.state()[booted].good:
        print(f"slot {booted or '-'} is not on trial: nothing to judge")
        return EXIT_OK
    socket = node.control_socket or f"{node.data_dir}/control.sock"
    timeout = args.timeout if args.timeout is not None else settings.health_timeout
    refused = refused_configuration(source.path) if source.path else []
    verdict = wait_healthy(lambda: control.call(socket, "status"), Path(settings.health_dir),
                           timeout, definite=lambda: refused or service_gave_up(systemd_show))  # fmt: skip
    found = verdict.problems
    for problem in found:
        print(f"unhealthy{' (for good: not waiting)' if verdict.definite else ''}: {problem}",
              file=sys.stderr)  # fmt: skip
    back = firmware.judge(not found)
    print(f"slot {booted} marked {'bad' if found else 'good'}")
    if back and not args.no_reboot:
        firmware.reboot()
    return EXIT_FAILURE if found else EXIT_OK


def cmd_mark_good(args: argparse.Namespace) -> int:
    firmware = firmware_of(args)
    firmware.judge(True)
    print(f"slot {firmware.booted()} is good")
    return EXIT_OK


def cmd_keygen(args: argparse.Namespace) -> int:
    from appliance.firmware.keys import keygen, public_text

    key = keygen(args.out)
    print(public_text(key.public_key()))
    return EXIT_OK


def cmd_bundle(args: argparse.Namespace) -> int:
    from appliance.firmware.keys import load_private, write_bundle

    files = {n: getattr(args, n) for n in ("rootfs", "kernel", "initrd") if getattr(args, n)}
    write_bundle(args.out, files, version=args.version, board=args.board,
                 key=load_private(args.key))  # fmt: skip
    print(f"{args.out}: version {args.version}, {', '.join(files)}")
    return EXIT_OK
