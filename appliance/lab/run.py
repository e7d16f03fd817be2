"""``rackboot lab`` from start to end: the checks (root, namespaces, programs, leftovers
of other labs), this lab's record, the virtual rack's story (appliance/lab/scenario.py),
and the teardown, whatever ended the story: success, a failure, Ctrl-C, SIGTERM, SIGHUP.
docs/lab.md."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from appliance.errors import LabUnavailable, RackbootError
from appliance.lab import census, leftovers, packages
from appliance.lab.netns import LabError, need_root, new_id, probe_netns
from appliance.lab.scenario import Settings, VirtualRack
from appliance.lab.screen import Screen

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class Options:
    once: bool
    workdir: Path | None
    cache: Path | None
    accel: str
    install: bool
    boot_timeout: float


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rackboot" / "lab"


def run_lab(options: Options, stream: TextIO = sys.stdout) -> int:
    """0 when both boots reached ``installed`` (and, without --once, the operator then
    pressed Ctrl-C); 130 interrupted before that; LabError (exit 1) for a failed story
    or an incomplete teardown; LabUnavailable (8) when the lab cannot run here."""
    screen = Screen(stream, live=stream.isatty() and not options.once)
    preflight(options.install, screen.say)
    verdict = leftovers.survey()
    if verdict.refusal():
        raise LabUnavailable(verdict.refusal())
    leftovers.clean_stale(verdict, screen.say)
    lab_id = _unused_id()
    own = options.workdir is None
    if options.workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix=f"{leftovers.OWN_WORKDIR}{lab_id}-"))
    else:
        workdir = options.workdir
        workdir.mkdir(parents=True, exist_ok=True)
    claim = leftovers.claim(lab_id, {"workdir": str(workdir), "remove_workdir": own})
    settings = Settings(workdir, options.cache or default_cache(), options.accel,
                        options.boot_timeout)  # fmt: skip
    rack = VirtualRack(lab_id, settings, screen)
    screen.say(f"lab {census.PREFIX}{lab_id}: files and logs in {workdir}")
    passed, interrupted, failure = False, False, ""
    try:
        with _signals(_interrupt):
            passed = _story(rack, options.once, screen)
            if passed and not options.once:
                rack.watch(None, None, "Ctrl-C")
    except KeyboardInterrupt:
        interrupted = True
    except RackbootError as exc:
        failure = str(exc)
    finally:
        with _signals(lambda signum, frame: screen.say("still tearing down, a few seconds")):
            screen.freeze()
            screen.say("tearing down: every process by its PID, every namespace")
            problems = rack.close()
            claim.release()
    if problems:
        raise LabError("teardown incomplete: " + "; ".join(problems))
    screen.say(f"torn down: nothing of lab {census.PREFIX}{lab_id} is left")
    if failure:
        raise LabError(f"{failure}\n(the logs stay in {workdir})")
    if own and (passed or interrupted):
        shutil.rmtree(workdir, ignore_errors=True)
    if interrupted and not passed:
        return 130
    return 0


def _story(rack: VirtualRack, once: bool, screen: Screen) -> bool:
    started = time.monotonic()
    rack.build()
    rack.start()
    up = time.monotonic() - started
    first = rack.boot("boot 1")
    failover = rack.fail_over()
    second = rack.boot("boot 2")
    if second.served_by != failover.active or second.served_by == failover.killed:
        raise LabError(f"boot 2 was served by {second.served_by}, not by the standby "
                       f"{failover.active} that took over")  # fmt: skip
    screen.say(
        f"PASS: rack up in {up:.1f} s; boot 1 by {first.served_by} installed in "
        f"{first.seconds:.1f} s; failover {failover.gap:.2f} s ({failover.killed} killed, "
        f"{failover.active} active, epoch {failover.epoch}); boot 2 by {second.served_by} "
        f"installed in {second.seconds:.1f} s"
    )
    if not once:
        rack.rejoin(failover.killed)
        rack.phase = "running"
        screen.say("the rack keeps running; from another terminal:")
        for hint in rack.hints():
            screen.say(f"  {hint}")
        screen.say("Ctrl-C tears it all down")
    return True


def preflight(install: bool, say: Callable[[str], None]) -> None:
    """What the lab needs from this machine; LabUnavailable naming what is missing."""
    reason = need_root() or probe_netns()
    if reason:
        raise LabUnavailable(f"{reason}: the lab builds network namespaces and a tap; "
                             "as a normal user run the standalone node: rackboot run")  # fmt: skip
    if not os.path.exists("/dev/net/tun"):
        raise LabUnavailable("/dev/net/tun is missing (no tap for the VM): modprobe tun")
    packages.ensure(install, say)


def _unused_id() -> str:
    taken = set(leftovers.records()) | set(census.by_lab(leftovers.namespaces()))
    for _ in range(100):
        lab_id = new_id()
        if lab_id not in taken:
            return lab_id
    raise LabError("no unused lab id after 100 tries")


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM and SIGHUP end the lab as Ctrl-C does: through the teardown."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` for SIGINT, SIGTERM and SIGHUP meanwhile. The teardown runs to its end
    under a handler that only says so: every wait in it has a deadline."""
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
