"""Profiling Rackboot under perfdhcp load (``--profile py-spy`` or ``--profile cprofile``).

* **py-spy** (``pip install py-spy``) attaches to the running server by PID for
  the length of the perfdhcp run and samples every thread (``--threads
  --idle``). The raw collapsed stacks are saved; :func:`summarize_collapsed`
  separates waits (epoll, an idle worker, fdatasync) from work and shows where
  the main thread's busy time goes: a few areas of the hot path (inclusive) and
  the busiest source lines (self), in percent of its busy samples.
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
# nested areas overlap (handle contains parse_untrusted, _discover, _request...).
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
        ("leases: LeaseTable.apply", r"\bLeaseTable\.apply \(plugins/dhcp/leases\.py"),
        ("store: LeaseStore.commit (encode, frame)", r"\bLeaseStore\.commit \(plugins/dhcp/store"),
        ("service: _send (sendto)", r"\b_send \(plugins/dhcp/service\.py"),
        ("service: _durable (after fdatasync)", r"\b_durable \(plugins/dhcp/service\.py"),
        ("metrics (ours and prometheus_client)", r"plugins/dhcp/metrics\.py|prometheus_client/"),
        ("journal: GroupCommitter.flush (trio side)", r"\bGroupCommitter\.flush \(appliance/journal"),
        ("trio: to_thread machinery", r"trio/_threads\.py|trio/_core/_thread_cache\.py"),
    )
)  # fmt: skip

# Leaf frames where a thread waits rather than computes (py-spy's own idle
# detection misses lock and epoll waits, so all samples are taken with --idle).
WAITS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("waiting in epoll (idle)", r"\bget_events \(trio/_core/_io_epoll\.py"),
        ("worker idle (no job)", r"\bWorkerThread\._work \(trio/_core/_thread_cache\.py"),
        ("in fdatasync", r"\bJournalFile\.append \(appliance/journal\.py"),
    )
)  # fmt: skip

_OURS = re.compile(r"\((plugins/|appliance/journal\.py)")
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
            thread = re.sub(r"^thread \(\d+\): ", "", frames[0])
            thread = "MainThread" if thread == "MainThread" else "worker threads"
            stacks[(thread, *(_short(f) for f in frames[1:]))] += int(count)
    return stacks


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
        parts = [
            f"{100.0 * w / n:.1f}% {name}" for (t, name), w in waits.most_common() if t == thread
        ]
        out.append(f"  {thread}: {n} samples; " + ("; ".join(parts) or "no waits seen"))
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
