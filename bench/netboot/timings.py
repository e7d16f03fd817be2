"""The pure part of bench.netboot: what one boot's records say, medians, the ratio table.

A boot is observed from four places, all in wall-clock seconds (``time.time()``,
the same clock for every process on this machine):

* the VM's power-on (QEMU's start) and its serial console, each line stamped when
  first read (:class:`appliance.lab.vm.Console`, seconds since power-on);
* the DHCP frames a sniffer saw on the server's link (the first DHCPACK to the
  VM's MAC; its ``yiaddr`` values say which client addresses are this VM's);
* the HTTP server's access log (Rackboot's ``ts=`` key=value lines, nginx's
  ``$msec`` lines in :data:`NGINX_LOG_FORMAT`): both write a line once the answer
  is sent, so a line's time is when the server finished sending that file.

No I/O here: the functions take text and numbers, so the unit tests feed them
recorded lines.
"""

from __future__ import annotations

import re
import statistics
from calendar import timegm
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MARK = "RACKBOOT-INSTALLER:"
# Stages in the order a boot passes them: (key, what the table calls it).
STAGES = (
    ("dhcp", "DHCPACK"),
    ("configured", "iPXE configured"),
    ("script", "script sent"),
    ("kernel", "kernel sent"),
    ("installed", "installed (console)"),
    ("event", "event answered"),
)
# What each server itself spent, summed per boot (milliseconds): the boot's timeline
# above is mostly the firmware's and the guest's, the same for both servers.
SERVER_TIMES = (
    ("dhcp_ms", "DHCP answers (sum)"),
    ("script_ms", "script request"),
    ("kernel_ms", "kernel request"),
)
ACK = 5
REPLY_TO = {2: 1, 5: 3, 6: 3}  # OFFER answers DISCOVER; ACK and NAK answer REQUEST
# nginx's side of the access log; Rackboot's is its own key=value access line.
NGINX_LOG_FORMAT = "$msec $remote_addr $request_method $uri $status $body_bytes_sent $request_time"
_RACKBOOT_ACCESS = re.compile(
    r"^ts=(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z .*logger=\S*httpboot\.access "
    r".*client=(\S+) method=(\S+) target=(\S+) status=(\d+)(?: .*\bms=([\d.]+))?"
)
_NGINX_ACCESS = re.compile(r"^(\d+\.\d+) (\S+) (\S+) (\S+) (\d+) \d+ ([\d.]+)$")
_CONFIGURED = re.compile(r"Configuring \(net0 .*\)\.* ok")


@dataclass(frozen=True)
class Access:
    """One answered HTTP request: when the server logged it (wall seconds) and what it was."""

    t: float
    client: str
    method: str
    path: str
    status: int
    ms: float | None = None  # how long the server says the request took


def rackboot_access(text: str) -> list[Access]:
    """The ``httpboot.access`` lines of a Rackboot node's log (other lines skipped)."""
    out = []
    for line in text.splitlines():
        m = _RACKBOOT_ACCESS.match(line)
        if m is None:
            continue
        y, mo, d, h, mi, s, ms = (int(x) for x in m.groups()[:7])
        wall = timegm((y, mo, d, h, mi, s, 0, 0, 0)) + ms / 1000
        path = m.group(10).split("?", 1)[0]
        ms = None if m.group(12) is None else float(m.group(12))
        out.append(Access(wall, m.group(8), m.group(9), path, int(m.group(11)), ms))
    return out


def nginx_access(text: str) -> list[Access]:
    """nginx's access log written with :data:`NGINX_LOG_FORMAT`."""
    out = []
    for line in text.splitlines():
        m = _NGINX_ACCESS.match(line.strip())
        if m is not None:
            out.append(Access(float(m[1]), m[2], m[3], m[4], int(m[5]), float(m[6]) * 1000))
    return out


def dhcp_acks(frames: Iterable[Mapping], mac: str) -> tuple[float | None, set[str]]:
    """(wall time of the first DHCPACK to ``mac``, every address ACKed to it) from the
    sniffer's frames (``tests.support.sniff``: ``t``, ``sport``, ``payload`` in hex)."""
    chaddr = bytes.fromhex(mac.replace(":", ""))
    first, addresses = None, set()
    for f in frames:
        if f.get("sport") != 67:
            continue
        data = bytes.fromhex(f["payload"])
        if len(data) < 240 or data[28:34] != chaddr or _message_type(data) != ACK:
            continue
        first = f["t"] if first is None else min(first, f["t"])
        addresses.add(".".join(map(str, data[16:20])))
    return first, addresses


def dhcp_reply_ms(frames: Iterable[Mapping], mac: str) -> float | None:
    """The sum, over the DHCP exchanges of ``mac``, of the server's time from the
    request it answered (DISCOVER or REQUEST, the latest of that xid) to its answer,
    as the sniffer on the server's link saw them (milliseconds; None: no answer)."""
    chaddr = bytes.fromhex(mac.replace(":", ""))
    asked: dict[tuple[int, int], float] = {}
    total, answered = 0.0, False
    for f in sorted(frames, key=lambda f: f["t"]):
        data = bytes.fromhex(f["payload"])
        if len(data) < 240 or data[28:34] != chaddr:
            continue
        kind, xid = _message_type(data), int.from_bytes(data[4:8], "big")
        if f.get("dport") == 67 and kind in (1, 3):
            asked[(xid, kind)] = f["t"]
        elif f.get("sport") == 67 and (xid, REPLY_TO.get(kind or 0, 0)) in asked:
            total += f["t"] - asked.pop((xid, REPLY_TO[kind or 0]))
            answered = True
    return round(total * 1000, 3) if answered else None


def _message_type(bootp: bytes) -> int | None:
    """Option 53 of a BOOTP/DHCP payload (after the magic cookie), bounded by its length."""
    i = 240
    while i < len(bootp):
        code = bootp[i]
        if code == 255:
            return None
        if code == 0:
            i += 1
            continue
        if i + 1 >= len(bootp):
            return None
        size = bootp[i + 1]
        if code == 53 and size >= 1 and i + 2 < len(bootp):
            return bootp[i + 2]
        i += 2 + size
    return None


@dataclass
class BootRecord:
    """What was seen of one VM's boot (the raw material of :func:`stages`)."""

    mac: str
    powered_on: float  # wall seconds
    console: Sequence[tuple[float, str]]  # (seconds since power-on, line)
    ack: float | None = None  # wall time of the first DHCPACK
    addresses: set[str] = field(default_factory=set)
    access: Sequence[Access] = ()  # the server's whole access log; filtered by addresses

    dhcp_ms: float | None = None  # dhcp_reply_ms of this VM's exchanges

    def first_access(self, method: str, path: str, statuses: tuple[int, ...]) -> Access | None:
        found = [a for a in self.access if a.client in self.addresses and a.method == method
                 and a.path == path and a.status in statuses]  # fmt: skip
        return min(found, key=lambda a: a.t) if found else None

    def console_at(self, pattern: str | re.Pattern) -> float | None:
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        return next((t for t, line in self.console if rx.search(line)), None)


def stages(boot: BootRecord) -> dict[str, float | None]:
    """Seconds from power-on to each stage of :data:`STAGES` (None: not seen)."""
    hyphens = boot.mac.replace(":", "-")

    script = boot.first_access("GET", f"/boot/{hyphens}.ipxe", (200,))
    kernel = boot.first_access("GET", "/boot/vmlinuz", (200,))
    event = boot.first_access("POST", f"/api/v1/machines/{hyphens}/events", (200, 201, 204))

    def since(wall: float | None) -> float | None:
        return None if wall is None else round(wall - boot.powered_on, 3)

    return {
        "dhcp": since(boot.ack),
        "configured": boot.console_at(_CONFIGURED),
        "script": since(script and script.t),
        "kernel": since(kernel and kernel.t),
        "installed": boot.console_at(f"{MARK} event posted"),
        "event": since(event and event.t),
        "dhcp_ms": boot.dhcp_ms,
        "script_ms": script and script.ms,
        "kernel_ms": kernel and kernel.ms,
    }


def failure(boot: BootRecord) -> str | None:
    """The installer's ``FAILED`` line, or why the boot never reported, or None."""
    failed = next((line for _, line in boot.console if f"{MARK} FAILED" in line), None)
    if failed:
        return failed
    if boot.console_at(f"{MARK} event posted") is None:
        return "no 'event posted' marker on the console"
    return None


def medians(runs: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    """Per stage, the median over the runs that saw it (None when none did)."""
    out: dict[str, float | None] = {}
    for key, _ in (*STAGES, *SERVER_TIMES):
        seen = [r[key] for r in runs if r.get(key) is not None]
        out[key] = round(statistics.median(seen), 3) if seen else None  # type: ignore[type-var]
    return out


def ratio(ours: float | None, peer: float | None) -> float | None:
    """Rackboot's time over the peer's: <= 1.0 means no slower."""
    if ours is None or peer is None or peer <= 0:
        return None
    return round(ours / peer, 3)


def ratio_table(title: str, ours: Mapping[str, float | None], peer: Mapping[str, float | None],
                names: tuple[str, str] = ("rackboot", "dnsmasq+nginx")) -> str:  # fmt: skip
    """The printed table of one firmware: a row per stage, medians and the ratio."""

    def cell(v: float | None, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    lines = [title, f"  {'from power-on to':<22}{names[0]:>12}{names[1]:>16}{'ratio':>9}"]
    for rows, unit, fmt in ((STAGES, "s ", ".2f"), (SERVER_TIMES, "ms", ".1f")):
        if unit == "ms":
            lines.append("  server's own time")
        for key, label in rows:
            r = ratio(ours.get(key), peer.get(key))
            verdict = "" if r is None or round(r, 2) <= 1.0 else "  slower"  # as printed
            lines.append(f"  {label:<22}{cell(ours.get(key), fmt):>9} {unit}"
                         f"{cell(peer.get(key), fmt):>13} {unit}{cell(r, '.2f') + ('x' if r is not None else ' '):>9}{verdict}")  # fmt: skip
    return "\n".join(lines)


def scale_summary(runs: Sequence[Mapping[str, float | None]], first_power_on: float,
                  powered_on: Sequence[float]) -> dict[str, float | int | None]:  # fmt: skip
    """N VMs at once: the time from the first power-on to the last ``installed`` (and to
    the last event answered), the median ``installed`` per VM, how many reported."""
    done = [(p + r["installed"]) for p, r in zip(powered_on, runs, strict=True)
            if r.get("installed") is not None]  # fmt: skip
    events = [(p + r["event"]) for p, r in zip(powered_on, runs, strict=True)
              if r.get("event") is not None]  # fmt: skip
    own = [r["installed"] for r in runs if r.get("installed") is not None]
    return {
        "vms": len(runs),
        "installed": len(done),
        "last_installed_s": round(max(done) - first_power_on, 3) if done else None,
        "last_event_s": round(max(events) - first_power_on, 3) if events else None,
        "median_installed_s": round(statistics.median(own), 3) if own else None,
        "power_on_spread_s": round(max(powered_on) - first_power_on, 3) if powered_on else None,
    }
