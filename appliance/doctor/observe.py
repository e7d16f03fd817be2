"""What the doctor reads from this machine's kernel (the shell of the pure checks):
the node's sockets from /proc, the clock's sync state from adjtimex(2). Stdlib only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from appliance.doctor.sockets import Bound, parse_table_untrusted
from appliance.doctor.timechecks import ClockSync

TABLES = (("udp", "udp"), ("udp6", "udp"), ("tcp", "tcp"), ("tcp6", "tcp"))
MAX_TABLE_BYTES = 16 * 1024 * 1024
MAX_PROCESSES = 4096  # scanned when naming the holder of a foreign socket
STA_UNSYNC = 0x0040  # <linux/timex.h>


def node_sockets(pid: int) -> tuple[list[Bound] | None, frozenset[int], str]:
    """The bound sockets of ``pid``'s network namespace, the socket inodes ``pid``
    holds, and why not when they cannot be read."""
    found: list[Bound] = []
    try:
        for name, protocol in TABLES:
            path = f"/proc/{pid}/net/{name}"
            if not os.path.exists(path):
                continue  # no IPv6 in this kernel
            with open(path, "rb") as table:
                text = table.read(MAX_TABLE_BYTES).decode("ascii", "replace")
            found += parse_table_untrusted(text, protocol)
        inodes = socket_inodes(pid)
    except OSError as exc:
        return None, frozenset(), f"{exc.filename or f'/proc/{pid}'}: {exc.strerror}"
    return found, inodes, ""


def socket_inodes(pid: int) -> frozenset[int]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:[") and target.endswith("]"):
            inodes.add(int(target[8:-1]))
    return frozenset(inodes)


def holders(inodes: set[int]) -> dict[int, str]:
    """Which programs hold these socket inodes: "dnsmasq (pid 812)"; bounded scan."""
    if not inodes:
        return {}
    found: dict[int, str] = {}
    pids = [p for p in os.listdir("/proc") if p.isdigit()][:MAX_PROCESSES]
    for pid in pids:
        try:
            held = socket_inodes(int(pid)) & inodes
            if held:
                with open(f"/proc/{pid}/comm") as comm:
                    name = comm.read().strip()
                for inode in held:
                    found.setdefault(inode, f"{name} (pid {pid})")
        except OSError:
            continue  # gone, or not ours to read
    return found


class _Timex(ctypes.Structure):
    """struct timex of <sys/timex.h> (Linux), read-only use (modes = 0)."""

    _fields_ = [
        ("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
        ("constant", ctypes.c_long), ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long), ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long),
        ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int), ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int), ("padding", ctypes.c_int * 11),
    ]  # fmt: skip


def clock_sync() -> ClockSync:
    """The kernel's NTP state, as timedatectl reads it: synchronized unless STA_UNSYNC."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        adjtimex = libc.adjtimex
    except (OSError, AttributeError, TypeError):
        return ClockSync(None, why_unknown="no adjtimex(2) here")
    timex = _Timex()  # modes 0: read only, any user may ask
    if adjtimex(ctypes.byref(timex)) < 0:
        return ClockSync(None, why_unknown=f"adjtimex: {os.strerror(ctypes.get_errno())}")
    return ClockSync(not timex.status & STA_UNSYNC, max_error=timex.maxerror / 1e6)
