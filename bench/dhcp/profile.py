"""Profiling Rackboot under perfdhcp load (``--profile py-spy`` or ``--profile cprofile``).

* **py-spy** (``pip install py-spy``) attaches to the running server by PID for
  the length of the perfdhcp run and samples every thread (``--threads
  --idle``). The raw collapsed stacks are saved; :func:`summarize_collapsed`
  separates waits (epoll, an idle trio worker or state log writer, the log's
  fdatasync) from work per thread (the main thread, the state log's writer
  ``state-log``, the others) and shows where the main thread's busy time goes: a
  few areas of the hot path (inclusive) and the busiest source lines (self), in
  percent of its busy samples.
* **cProfile** wraps the server (``python -m cProfile -o FILE -m appliance``):
  deterministic but it slows Python code about 2x, so its percentages lean
  towards Python-heavy parts; the saved ``.pstats`` opens with ``pstats``.

Profiles go to bench/results/ (gitignored), one file per run.
"""

from __future__ import annotations

import pstats
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

PY_SPY_RATE = 200  # samples per second

# Areas of the main thread's work, matched against frames "function (path:line)". A
# sample counts for every area one of its frames belongs to (inclusive time), so
# nested areas overlap (handle contains parse_untrusted, _discover, _request...; a
# group commit's StateStore.advance runs the commit callbacks: _durable, _send).
AREAS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("service: receive loop, all it calls", r"\b_(receive|drain) \(plugins/dhcp/service\.py"),
        ("server: DhcpServer.handle", r"\bDhcpServer\.handle \(plugins/dhcp/server\.py"),
        ("codec: parse_untrusted", r"\bparse_untrusted \(plugins/dhcp/codec\.py"),
        ("server: _discover", r"\b_discover \(plugins/dhcp/server\.py"),
        ("server: _request", r"\b_request \(plugins/dhcp/server\.py"),
        ("server: _reply (options, boot, build)", r"\b_reply \(plugins/dhcp/server\.py"),
        ("codec: build", r"\bbuild \(plugins/dhcp/codec\.py"),
        ("leases: lease table and view (plugins/dhcp/leases.py)", r"\(plugins/dhcp/leases\.py"),
        ("lease store: LeaseStore.commit (lease -> state records)", r"\bLeaseStore\.commit \(plugins/dhcp/store\.py"),
        ("changefeed: LeaseStore.follow (committed leases -> table)", r"\bLeaseStore\.follow \(plugins/dhcp/store\.py"),
        ("state: StateStore.append / append_replicated (encode, frame)", r"\bStateStore\.append(_replicated)? \(appliance/state/store\.py"),
        ("state: StateStore._write (group commit, trio side)", r"\bStateStore\._write \(appliance/state/store\.py"),
        ("state: hand-off to the log's writer thread", r"\bWorker\.__call__ \(appliance/state/log\.py"),
        ("state: StateStore.advance (commit, callbacks)", r"\bStateStore\.advance \(appliance/state/store\.py"),
        ("service: _send (sendto)", r"\b_send \(plugins/dhcp/service\.py"),
        ("service: _durable (after the commit)", r"\b_durable \(plugins/dhcp/service\.py"),
        ("replication (appliance/state/replication.py, service.py)", r"\(appliance/state/(replication|service)\.py"),
        ("signing: Ed25519 frames (appliance/state/signing.py)", r"\(appliance/state/signing\.py"),
        ("ha: election, VIP (appliance/ha/)", r"\(appliance/ha/"),
        ("metrics (ours and prometheus_client)", r"plugins/dhcp/metrics\.py|prometheus_client/"),
        ("trio: to_thread machinery", r"trio/_threads\.py|trio/_core/_thread_cache\.py"),
    )
)  # fmt: skip

# Leaf frames where a thread waits rather than computes (py-spy's own idle
# detection misses lock and epoll waits, so all samples are taken with --idle).
# The state log's writer thread (appliance/state/log.py ``Worker``) waits for a job
# in ``Worker._serve`` (queue.get) and runs each group commit's
# ``JournalFile.append`` (appliance/journal.py), whose only blocking call of its
# own is ``os.fdatasync`` (the write itself is in ``_write_all``).
WAITS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("waiting in epoll (idle)", r"\bget_events \(trio/_core/_io_epoll\.py"),
        ("worker idle (no job)", r"\bWorkerThread\._work \(trio/_core/_thread_cache\.py"),
        ("log writer idle (no job)", r"\bWorker\._serve \(appliance/state/log\.py"),
        ("in fdatasync", r"\bJournalFile\.append \(appliance/journal\.py"),
    )
)  # fmt: skip

# Our code, as opposed to trio's scheduler and the interpreter. Every main-thread
# stack starts in appliance/__main__.py and appliance/cli.py (cmd_run): those
# frames say nothing about where the time goes, so they are not "ours" here.
_OURS = re.compile(r"\((plugins/|appliance/(?!__main__\.py|cli\.py))")
# The main thread, when py-spy gives no thread name: its stack starts at the module.
_MAIN_ROOT = re.compile(r"^(_run_module_as_main \(|<module> \()")
# Threads by name: the state log's writer has its own line; trio's cache threads
# ("Trio thread N", renamed after their job while they run one) and the rest share one.
LOG_WRITER = "state-log"
_FRAME_LINE = re.compile(r"^(?P<func>.*) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)$")


def py_spy_path() -> str | None:
    """py-spy on PATH, else the one pip put beside this Python (a venv's bin/)."""
    import sys

    found = shutil.which("py-spy")
    if found is None:
        beside = Path(sys.executable).parent / "py-spy"
        found = str(beside) if beside.exists() else None
    return found


def py_spy_available() -> str | None:
    """None when py-spy can be used, else why not."""
    if py_spy_path() is None:
        return "py-spy is not installed (pip install py-spy), or use --profile cprofile"
    return None


def start_py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    """Sample ``pid`` for ``seconds`` into ``out`` (collapsed stacks, one thread per root)."""
    argv = [
        py_spy_path() or "py-spy", "record", "--pid", str(pid), "--rate", str(PY_SPY_RATE),
        "--duration", str(max(1, round(seconds))), "--format", "raw", "--threads", "--idle",
        "--output", str(out),
    ]  # fmt: skip
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _short(frame: str) -> str:
    """``func (/usr/lib/…/trio/_core/_run.py:1)`` -> ``func (trio/_core/_run.py:1)``."""
    m = _FRAME_LINE.match(frame)
    if not m:
        return frame
    path = m.group("path")
    if path.startswith("/"):
        for root in ("plugins/", "appliance/", "bench/", "trio/", "prometheus_client/"):
            cut = path.rfind("/" + root)
            if cut >= 0:
                path = path[cut + 1 :]
                break
        else:
            path = "/".join(path.rsplit("/", 2)[-2:])
    line = f":{m.group('line')}" if m.group("line") else ""
    return f"{m.group('func')} ({path}{line})"


def read_collapsed(paths: list[Path]) -> Counter[tuple[str, ...]]:
    """Add up py-spy raw files: stack (root first, thread name first) -> samples."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            rest = frames[1:]
            stacks[(_thread(frames[0], rest), *(_short(f) for f in rest))] += int(count)
    return stacks


def _thread(root: str, frames: list[str]) -> str:
    """The group a py-spy thread root (``thread (1234): MainThread``, or ``thread (1234)``
    without a name, or ``thread (0x7f…): name``) belongs to: ``MainThread``, the state
    log's writer, or the other threads (trio's worker threads, mostly)."""
    name = re.sub(r"^thread \((0x)?[0-9a-fA-F]+\)(: )?", "", root)
    if name == "MainThread" or (not name and frames and _MAIN_ROOT.match(frames[0])):
        return "MainThread"
    if name == LOG_WRITER:
        return f"{LOG_WRITER} (the state log's writer thread)"
    return "other threads"


def summarize_collapsed(stacks: Counter[tuple[str, ...]], top: int = 25) -> str:
    """Where the time goes: waits per thread, then the main thread's busy samples by area
    (inclusive) and by source line (self), in percent of its busy samples."""
    per_thread: Counter[str] = Counter()
    waits: Counter[tuple[str, str]] = Counter()
    busy: Counter[tuple[str, ...]] = Counter()
    for stack, n in stacks.items():
        thread, frames = stack[0], stack[1:]
        per_thread[thread] += n
        leaf = frames[-1] if frames else ""
        wait = next((name for name, pattern in WAITS if pattern.search(leaf)), None)
        if wait is not None:
            waits[(thread, wait)] += n
        elif thread == "MainThread":
            busy[frames] += n
    if not per_thread:
        return "no samples (py-spy could not attach?)"
    out = [f"py-spy at {PY_SPY_RATE}/s, all samples (--idle):"]
    for thread, n in per_thread.most_common():
        mine = [(name, w) for (t, name), w in waits.most_common() if t == thread]
        parts = [f"{100.0 * w / n:.1f}% {name}" for name, w in mine]
        parts.append(f"{100.0 * (n - sum(w for _, w in mine)) / n:.1f}% busy")
        out.append(f"  {thread}: {n} samples; " + "; ".join(parts))
    total = sum(busy.values())
    if not total:
        return "\n".join([*out, "the main thread never looked busy"])
    main = per_thread["MainThread"]
    out.append(
        f"main thread busy in {total} samples ({100.0 * total / main:.1f}% of its samples); "
        "percentages below are of those busy samples"
    )
    areas: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    outside = 0  # trio's scheduler, epoll bookkeeping, thread hand-offs: none of our frames
    for frames, n in busy.items():
        self_time[frames[-1] if frames else "(no Python frame)"] += n
        for name, pattern in AREAS:
            if any(pattern.search(f) for f in frames):
                areas[name] += n
        if not any(_OURS.search(f) for f in frames):
            outside += n

    def pct(n: int) -> str:
        return f"{100.0 * n / total:5.1f}%"

    out.append("areas (inclusive; nested ones overlap):")
    out += [f"  {pct(areas[name])}  {name}" for name, _ in AREAS if areas[name]]
    out.append(f"  {pct(outside)}  outside our code (trio scheduling and I/O bookkeeping)")
    out.append(f"top {top} source lines by self time:")
    out += [f"  {pct(n)}  {frame}" for frame, n in self_time.most_common(top)]
    return "\n".join(out)


def summarize_pstats(paths: list[Path], top: int = 25) -> str:
    stats = None
    for path in paths:
        if not path.exists():
            continue
        try:
            stats = pstats.Stats(str(path)) if stats is None else stats.add(str(path)) or stats
        except (OSError, TypeError, EOFError) as exc:
            return f"cannot read {path}: {exc}"
    if stats is None:
        return "no cProfile output (did the server exit cleanly?)"
    rows = stats.stats  # (file, line, func) -> (cc, nc, tt, ct, callers)
    total = sum(tt for _, _, tt, _, _ in rows.values()) or 1.0
    idle = re.compile(r"epoll|select\.epoll|_thread\.lock|acquire")
    busy = {k: v for k, v in rows.items() if not idle.search(k[2])}
    busy_total = sum(v[2] for v in busy.values()) or 1.0
    out = [
        f"cProfile: {total:.2f} s profiled, {busy_total:.2f} s outside waits "
        "(percent of that; cProfile slows Python code ~2x)",
        f"top {top} functions by own time:",
    ]
    for (path, line, func), (_, calls, tt, ct, _) in sorted(
        busy.items(), key=lambda kv: kv[1][2], reverse=True
    )[:top]:
        where = _short(f"{func} ({path}:{line})")
        out.append(f"  {100 * tt / busy_total:5.1f}%  {calls:>9} calls  cum {ct:6.2f} s  {where}")
    return "\n".join(out)
