"""Setup's network step: the files of :mod:`.networkd` written where systemd-networkd
reads them, reloaded, and the addresses waited for (docs/setup.md, "The network").

Where: the directory ``network`` beside the configuration file when the system's own
``/etc/systemd/network`` resolves to it, as on the images (a link made at build time
into the data partition: the root is read-only); else ``--network-dir DIR``. Anywhere
else setup shows the files and writes nothing: a machine that is not an appliance
manages its network its own way.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.errors import EXIT_FAILURE, EXIT_OK
from appliance.schema import validate_table
from appliance.setup.networkd import FILE_PREFIX, NETWORK, files, links
from appliance.setup.system import write_atomically

SYSTEM_NETWORK_DIR = Path("/etc/systemd/network")
OURS = re.compile(rf"\d\d-{re.escape(FILE_PREFIX)}.*\.network")
ADDRESS_TIMEOUT = 20.0  # systemd-networkd sets static addresses within a second
POLL = 0.5


def managed_dir(config: Path, system_dir: Path = SYSTEM_NETWORK_DIR) -> Path | None:
    """``config``'s ``network`` directory when systemd-networkd reads it, else None."""
    beside = config.parent / "network"
    return beside if networkd_reads(beside, system_dir) else None


def write_files(directory: Path, files: dict[str, str]) -> list[str]:
    """Each file written atomically (setup.system.write_atomically); then the files
    setup wrote before and no longer needs removed (only names it writes: any other
    file in ``directory`` is left alone). Returns the names removed."""
    for name, text in files.items():
        write_atomically(directory / name, text, 0o644)
    removed = []
    for name in sorted(os.listdir(directory)):
        if OURS.fullmatch(name) and name not in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / name)
            removed.append(name)
    return removed


def networkd_reads(directory: Path, system_dir: Path = SYSTEM_NETWORK_DIR) -> bool:
    return os.path.realpath(system_dir) == os.path.realpath(directory)


def reload(run: Callable[..., Any] = subprocess.run) -> str | None:
    """``networkctl reload`` when systemd-networkd runs: None when done, else why not."""
    active = run(["systemctl", "is-active", "--quiet", "systemd-networkd"], check=False)
    if active.returncode != 0:
        return "systemd-networkd is not running: the files apply at its next start"
    done = run(["networkctl", "reload"], check=False, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"networkctl reload: {(done.stderr or done.stdout).strip() or done.returncode}"
    return None


def missing_addresses(
    network: Any,
    run: Callable[..., Any] = subprocess.run,
    timeout: float = ADDRESS_TIMEOUT,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Wait until every interface carries its addresses (the node reads them when it
    starts), at most ``timeout`` s; what is still missing, as ``IFACE ADDRESS``."""
    deadline = clock() + timeout
    for _ in range(int(timeout / POLL) + 2):  # bounded whatever the clock does
        missing = []
        for link in links(network):
            shown = run(["ip", "-4", "-o", "addr", "show", "dev", link.interface],
                        check=False, capture_output=True, text=True, timeout=10).stdout  # fmt: skip
            missing += [f"{link.interface} {a}" for a in link.addresses if f" {a} " not in shown]
        if not missing or clock() >= deadline:
            return missing
        sleep(POLL)
    return missing


def step(config: Path, table: dict[str, Any], chosen: Path | None,
         say: Callable[[str], None]) -> int:  # fmt: skip
    """Setup's network step for ``table`` (``[network]`` as written to ``config``)."""
    network = validate_table(NETWORK.fields, table, str(config), "network", dev=False)
    texts = files(network, str(config))
    target = chosen or managed_dir(config)
    if not texts:
        return EXIT_OK
    if target is None:
        say(f"\nThe network: not written (systemd-networkd does not read "
            f"{config.parent / 'network'} on this machine; --network-dir DIR writes these "
            "files there):")  # fmt: skip
        for name, text in texts.items():
            say(f"--- {name}\n{text.rstrip()}")
        return EXIT_OK
    try:
        removed = write_files(target, texts)
    except OSError as exc:
        say(f"rackboot: error: the network files in {target}: {exc}")
        say(f"The configuration is written; once that is fixed, run `rackboot setup --config "
            f"{config}` again ([Enter] keeps every answer).")  # fmt: skip
        return EXIT_FAILURE
    dropped = f"; removed {', '.join(removed)}" if removed else ""
    say(f"Wrote {', '.join(texts)} to {target}{dropped}.")
    if not networkd_reads(target):
        return EXIT_OK
    why = reload()
    if why is not None:
        say(f"The network: {why}.")
        return EXIT_OK
    missing = missing_addresses(network)
    if missing:
        say(f"The network: not set yet after {ADDRESS_TIMEOUT:g} s: {', '.join(missing)} "
            "(`networkctl status` says why).")  # fmt: skip
    else:
        shown = ", ".join(f"{link.interface} {' '.join(map(str, link.addresses))}"
                          for link in links(network))  # fmt: skip
        say(f"The network: systemd-networkd reloaded; {shown}.")
    return EXIT_OK
