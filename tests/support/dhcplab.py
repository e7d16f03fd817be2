"""A Rackboot DHCP server and real DHCP clients in a :class:`~appliance.lab.netns.Lab`.

* :class:`DhcpNode` (appliance/lab/node.py, shared with ``rackboot lab``): ``rackboot
  run`` in a host's namespace with a ``[dhcp]`` section of the test's choosing, ready
  once its control socket says DHCP is serving; asked for leases and metrics over that
  socket (or through the CLI); stopped, or killed, by its PID.
* :class:`Udhcpc`, :class:`Dhclient`, :class:`Dhcpcd`: the real clients in a
  bare host's namespace, each with a hook script that appends what the client
  was told to a JSON-lines file, so a test waits for an *event* (``bound``,
  ``renew``, ...) and reads the options the client itself decoded.
* :class:`Sniffer`: an ``AF_PACKET`` capture of DHCP frames on one interface,
  in a helper process inside the namespace (``python -m tests.support.sniff``).

Every wait has a deadline and polls with short sleeps (appliance/lab/processes.py);
every process is started through ``Host.popen`` (the lab ends it at close if a test
did not) and stopped here by its own PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from appliance.lab.netns import Host
from appliance.lab.node import DhcpNode, NodeExited  # noqa: F401 (the tests import them here)
from appliance.lab.processes import (  # noqa: F401 (the tests import them here)
    POLL,
    Timeout,
    rackboot,
    stop_process,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The child's next stdout line, waited for with a deadline (a bare readline has none).
    "" at its end of output."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], max(timeout, 0.0))
    if not ready:
        raise Timeout(f"pid {proc.pid} printed no line within {timeout:.1f} s")
    return proc.stdout.readline()


def dropped(metrics_text: str) -> dict[str, float]:
    """``rackboot_dhcp_dropped_total`` by reason, from Prometheus text."""
    prefix = 'rackboot_dhcp_dropped_total{reason="'
    counts = {}
    for line in metrics_text.splitlines():
        if line.startswith(prefix):
            reason, _, value = line[len(prefix) :].partition('"} ')
            counts[reason] = float(value)
    return counts


# -- the clients ------------------------------------------------------------------


class Events:
    """The JSON-lines file a client's hook script appends to: one object per event."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def all(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line being written right now
                out.append(json.loads(line))
        return out

    def wait(self, event: str | tuple[str, ...], timeout: float, *, after: int = 0,
             proc: subprocess.Popen | None = None, log: Path | None = None) -> dict[str, str]:  # fmt: skip
        """The first event named ``event`` past the first ``after`` events."""
        names = (event,) if isinstance(event, str) else event

        def check() -> dict[str, str] | None:
            for item in self.all()[after:]:
                if item["event"] in names:
                    return item
            if proc is not None and proc.poll() is not None:
                found = self.all()[after:]
                if not any(item["event"] in names for item in found):
                    raise AssertionError(f"client exited {proc.returncode}; events {found}\n"
                                         f"{log.read_text() if log else ''}")  # fmt: skip
            return None

        def detail() -> str:
            return f"events so far: {self.all()}\n{log.read_text() if log and log.exists() else ''}"

        return wait_until(check, timeout, f"client event {names}", detail=detail)


# The hook scripts write one JSON object per event with the variables the client
# exported (theirs are lower case; the environment's own are left out); python
# only encodes, so any value survives.
_DUMP = (
    f'{sys.executable} -c "import json,os,sys; '
    "e={k: v for k, v in os.environ.items() if k.islower()}; "
    'print(json.dumps({**e, \'event\': sys.argv[1]}), flush=True)" "$EVENT" '
    '>> "$OUT"'
)


def _script(path: Path, out: Path, event_var: str, body: str) -> Path:
    path.write_text(
        f'#!/bin/sh\nOUT="{out}"\nEVENT="{event_var}"\n' + body + "\n" + _DUMP + "\nexit 0\n"
    )
    path.chmod(0o755)
    return path


class _Client:
    """What the three clients share: their process, event file and log."""

    proc: subprocess.Popen | None = None
    events: Events
    log: Path

    def wait(self, event: str | tuple[str, ...], timeout: float = 10.0, *, after: int = 0):
        return self.events.wait(event, timeout, after=after, proc=self.proc, log=self.log)

    def nudge(self, sig: int, event: str, timeout: float = 10.0) -> dict[str, str]:
        """Send ``sig`` until the client reports ``event``, once a second: a signal that
        lands while the client runs its hook script can go unheard (dhcpcd)."""
        assert self.proc is not None and self.proc.poll() is None
        before = len(self.events.all())
        deadline = time.monotonic() + timeout
        while True:
            self.proc.send_signal(sig)  # a no-op once it has exited
            left = deadline - time.monotonic()
            try:
                return self.wait(event, min(1.0, max(left, 0.0)), after=before)
            except Timeout:
                if left <= 1.0:
                    raise

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


class Udhcpc(_Client):
    """busybox udhcpc in the foreground; its -s script configures the address and records.

    Events are udhcpc's: deconfig, bound, renew, nak, leasefail. SIGUSR1 renews,
    SIGUSR2 releases (both by the PID we hold: :meth:`nudge`).
    """

    def __init__(self, host: Host, workdir: Path, *, extra: tuple[str, ...] = ()) -> None:
        self.host = host
        workdir.mkdir(parents=True, exist_ok=True)
        self.events = Events(workdir / "udhcpc.events")
        self.log = workdir / "udhcpc.log"
        body = textwrap.dedent(
            """\
            case "$1" in
              deconfig) ip -4 addr flush dev "$interface" ;;
              bound|renew) ip addr replace "$ip/$mask" dev "$interface" ;;
            esac"""
        )
        self.script = _script(workdir / "udhcpc.sh", self.events.path, "$1", body)
        self.argv = ["udhcpc", "-f", "-i", host.ifname, "-s", str(self.script),
                     "-t", "20", "-T", "1", "-A", "1", "-O", "mtu", "-O", "staticroutes",
                     "-O", "ntpsrv", *extra]  # fmt: skip
        self.proc: subprocess.Popen | None = None

    def start(self) -> Udhcpc:
        with self.log.open("a") as out:
            self.proc = self.host.popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        return self


class Dhclient(_Client):
    """ISC dhclient in the foreground (-d), with its own config, lease, PID file and -sf script.

    Events are dhclient's ``$reason``: PREINIT, BOUND, RENEW, REBOOT, RELEASE, ...
    A second :meth:`start` with the same lease file begins in INIT-REBOOT.
    """

    CONF = textwrap.dedent(
        """\
        option rfc3442-classless-static-routes code 121 = array of unsigned integer 8;
        request subnet-mask, broadcast-address, time-offset, routers,
                domain-name, domain-name-servers, host-name, interface-mtu,
                rfc3442-classless-static-routes, ntp-servers;
        timeout 20;
        retry 1;
        initial-interval 1;
        """
    )

    def __init__(self, host: Host, workdir: Path) -> None:
        self.host = host
        workdir.mkdir(parents=True, exist_ok=True)
        self.events = Events(workdir / "dhclient.events")
        self.log = workdir / "dhclient.log"
        self.conf = workdir / "dhclient.conf"
        self.conf.write_text(self.CONF)
        self.leases = workdir / "dhclient.leases"
        self.pidfile = workdir / "dhclient.pid"
        body = textwrap.dedent(
            """\
            case "$reason" in
              BOUND|RENEW|REBIND|REBOOT)
                ip addr replace "$new_ip_address/$new_subnet_mask" dev "$interface" ;;
              EXPIRE|FAIL|RELEASE|STOP) ip -4 addr flush dev "$interface" ;;
            esac"""
        )
        self.script = _script(workdir / "dhclient.sh", self.events.path, "$reason", body)
        self.proc: subprocess.Popen | None = None

    def _argv(self, *flags: str) -> list[str]:
        return ["dhclient", "-4", *flags, "-cf", str(self.conf), "-lf", str(self.leases),
                "-pf", str(self.pidfile), "-sf", str(self.script), self.host.ifname]  # fmt: skip

    def start(self) -> Dhclient:
        with self.log.open("a") as out:
            self.proc = self.host.popen(
                self._argv("-d", "-v"), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        return self

    def wait_bound(self, event: str | tuple[str, ...] = "BOUND", timeout: float = 10.0,
                   *, after: int = 0) -> dict[str, str]:  # fmt: skip
        """``event``, then the lease written to the lease file (dhclient writes it only
        after its script returned: stopping it before that loses the lease)."""
        found = self.wait(event, timeout, after=after)
        address = found["new_ip_address"]
        wait_until(
            lambda: self.leases.exists() and f"fixed-address {address};" in self.leases.read_text(),
            5.0, f"dhclient lease file with {address}", detail=self.log.read_text,
        )  # fmt: skip
        return found

    def release(self) -> dict[str, str]:
        """``dhclient -r``: sends DHCPRELEASE; the running instance (ours) is stopped first."""
        before = len(self.events.all())
        self.stop()
        with self.log.open("a") as out:
            res = self.host.run(self._argv("-r", "-v"), stdout=out, stderr=subprocess.STDOUT,
                                capture_output=False, timeout=20)  # fmt: skip
        assert res.returncode == 0, self.log.read_text()
        return self.events.wait("RELEASE", 5.0, after=before, log=self.log)


class Dhcpcd(_Client):
    """dhcpcd (IPv4 only, no ARP probing, no IPv4LL) in the foreground with a -c script.

    dhcpcd keeps its lease and control socket in fixed directories; tmpfs mounts
    in the private mount namespace ``ip netns exec`` gives each command keep them
    out of the host's /var/lib and /run. ``$reason`` as dhclient's (BOUND, ...).
    SIGUSR1 renews; SIGALRM releases and exits (:meth:`nudge`).
    """

    def __init__(self, host: Host, workdir: Path, *, extra: tuple[str, ...] = ()) -> None:
        """``extra``: more arguments, e.g. ``("-s", "192.0.2.7/24")`` for an INFORM."""
        self.host = host
        self.extra = extra
        workdir.mkdir(parents=True, exist_ok=True)
        self.events = Events(workdir / "dhcpcd.events")
        self.log = workdir / "dhcpcd.log"
        self.conf = workdir / "dhcpcd.conf"
        self.conf.write_text(
            "ipv4only\nnoipv4ll\nnoarp\nnodelay\nnohook resolv.conf, timesyncd, hostname, ntp\n"
            "option domain_name_servers, domain_name, host_name, routers, subnet_mask\n"
            "option interface_mtu, classless_static_routes, ntp_servers\n"
        )
        self.script = _script(workdir / "dhcpcd.sh", self.events.path, "$reason", "")
        self.proc: subprocess.Popen | None = None

    def start(self) -> Dhcpcd:
        # ip netns exec gave us a mount namespace of our own (a slave of the host's).
        inner = 'mount -t tmpfs rbt /var/lib/dhcpcd && mount -t tmpfs rbt /run && exec "$@"'
        argv = ["dhcpcd", "-B", "-d", "-f", str(self.conf), "-c", str(self.script),
                "-t", "20", *self.extra, self.host.ifname]  # fmt: skip
        with self.log.open("a") as out:
            self.proc = self.host.popen(
                ["sh", "-c", inner, "sh", *argv], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        return self

    def stop(self) -> None:
        """SIGTERM to dhcpcd by its PID; then SIGKILL any of its privilege-separation
        helpers still in the client's namespace (one made by the lab: all in it is ours),
        which dhcpcd can leave behind when stopped in the middle of starting one."""
        super().stop()
        listed = subprocess.run(["ip", "netns", "pids", self.host.ns], capture_output=True,
                                text=True, timeout=10)  # fmt: skip
        for pid in map(int, listed.stdout.split()):
            with contextlib.suppress(OSError):  # gone meanwhile
                if Path(f"/proc/{pid}/comm").read_text().strip() == "dhcpcd":
                    os.kill(pid, signal.SIGKILL)


# -- capture -------------------------------------------------------------------------


def dhcp_options(payload_hex: str) -> dict[int, bytes]:
    """The options field of a captured DHCP payload, read by hand (first instance of each;
    no overload): an oracle independent of Rackboot's codec for a few checks."""
    data = bytes.fromhex(payload_hex)
    assert data[236:240] == b"\x63\x82\x53\x63", "not a DHCP message"
    options: dict[int, bytes] = {}
    i = 240
    while i < len(data) and data[i] != 255:
        if data[i] == 0:
            i += 1
            continue
        code, length = data[i], data[i + 1]
        options.setdefault(code, data[i + 2 : i + 2 + length])
        i += 2 + length
    assert 52 not in options, "overloaded message: read it with a real decoder"
    return options


def bootp_fields(payload_hex: str) -> dict[str, Any]:
    """op, xid, flags and yiaddr of a captured payload."""
    data = bytes.fromhex(payload_hex)
    return {
        "op": data[0],
        "xid": int.from_bytes(data[4:8], "big"),
        "flags": int.from_bytes(data[10:12], "big"),
        "ciaddr": ".".join(map(str, data[12:16])),
        "yiaddr": ".".join(map(str, data[16:20])),
        "giaddr": ".".join(map(str, data[24:28])),
        "type": dhcp_options(payload_hex).get(53, b"\0")[0],
    }


class Sniffer:
    """DHCP frames (UDP 67/68) seen on ``host``'s interface, captured in its namespace."""

    def __init__(self, host: Host, workdir: Path, ifname: str | None = None) -> None:
        self.host = host
        self.out = workdir / f"sniff-{ifname or host.ifname}.jsonl"
        self.proc = host.popen(
            [sys.executable, "-m", "tests.support.sniff", ifname or host.ifname, str(self.out)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=REPO,
        )  # fmt: skip
        ready, _, _ = select.select([self.proc.stdout], [], [], 15.0)
        assert ready and self.proc.stdout.readline().strip() == "ready", "sniffer did not start"

    def frames(self) -> list[dict[str, Any]]:
        return Events(self.out).all()

    def stop(self) -> list[dict[str, Any]]:
        stop_process(self.proc)
        return self.frames()
