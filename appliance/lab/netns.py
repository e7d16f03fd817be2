"""A private L2 lab made only of network namespaces: ``rackboot lab``'s rack, and the
real tests' and benchmarks' links.

Layout of one :class:`Lab`::

    [ns <p><id>-a]  a-<id> 10.X.Y.1/24 --veth-- v1-<id> \\
                                                      [ns <p><id>-br] bridge br-<id>
    [ns <p><id>-b]  b-<id> 10.X.Y.2/24 --veth-- v2-<id> /

A host added with ``bare=True`` gets no address (a DHCP client's link), and
:meth:`Lab.attach` plugs a host that already exists, perhaps another lab's,
into this lab's bridge too: two labs make two links, and a host on both is a
router or a DHCP relay.

Nothing touches the host's own namespace: veths are created inside the bridge
namespace with their far end moved straight into the host namespace, and no
namespace gets a default route, so lab traffic cannot leave 10.X.Y.0/24. Every
name carries a random id so parallel or leftover labs never collide.

Resources are recorded *before* they are created, so :meth:`Lab.close` can
always tear down whatever exists, however far setup got.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import struct
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from appliance.errors import RackbootError

IP_TIMEOUT = 10.0  # one `ip` command; they normally take milliseconds
IFNAMSIZ = 15  # Linux interface name limit (16 bytes with the NUL)


class LabError(RackbootError):
    """A lab command failed; the text carries the command and its stderr."""


def need_root() -> str | None:
    """Why the real layer cannot run here, or None when we are root."""
    if os.geteuid() != 0:
        return f"needs root for network namespaces (euid {os.geteuid()})"
    return None


def have_commands(*names: str) -> bool:
    return all(shutil.which(n) for n in names)


def probe_netns() -> str | None:
    """Why namespaces cannot be made here (e.g. a container without CAP_SYS_ADMIN), or None."""
    if not have_commands("ip"):
        return "the `ip` command (iproute2) is not installed"
    name = f"rbprobe-{secrets.token_hex(4)}"
    try:
        _ip("netns", "add", name)
    except LabError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _ip("netns", "del", name)
    except LabError as exc:
        return f"cannot delete a network namespace: {exc}"
    return None


def _ip(*args: str) -> None:
    """Run one `ip` command; tests replace this to inject failures."""
    argv = ["ip", *args]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(argv)}: no answer within {IP_TIMEOUT} s") from None
    if res.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {res.stderr.strip() or f'exit {res.returncode}'}")


def new_id() -> str:
    """A lab's id: 6 hex characters, so names stay well under IFNAMSIZ."""
    return secrets.token_hex(3)


def netns_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


def delete_netns(name: str) -> None:
    """Delete namespace ``name`` if it exists (what runs in it should have ended first)."""
    if netns_exists(name):
        _ip("netns", "del", name)


@dataclass
class Host:
    """One namespace on the lab bridge. ``addr`` is a plain string, handy for argv."""

    lab: Lab = field(repr=False)
    name: str
    ns: str
    ifname: str
    addr: str
    network: ipaddress.IPv4Network

    @property
    def mac(self) -> str:
        """The interface's MAC address, ``aa:bb:cc:dd:ee:ff``."""
        res = self.run(["cat", f"/sys/class/net/{self.ifname}/address"], check=True)
        return res.stdout.strip()

    def run(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` inside this namespace (captured text output, 30 s timeout by default)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 30)
        return subprocess.run(["ip", "netns", "exec", self.ns, *argv], **kw)

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen:
        """Start ``argv`` inside this namespace; the lab stops it at close().

        `ip netns exec` execs the command in place, so the PID is the command's own.
        In a session of its own: a Ctrl-C at the terminal reaches the lab, which stops
        its processes in order, not every process at once.
        """
        kw.setdefault("start_new_session", True)
        return self.lab._track(subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], **kw))


class Lab:
    """A bridge in its own namespace plus hosts added with :meth:`add_host`.

    Use as a context manager or call :meth:`close`; a constructor that fails
    half-way has already cleaned up after itself.
    """

    def __init__(
        self, *, prefix: str = "rbt", lowlat: bool = False, avoid: tuple[Lab, ...] = (),
        lab_id: str | None = None,
    ) -> None:  # fmt: skip
        """``avoid``: labs whose networks this one must not overlap (a second link);
        ``lab_id``: the id in every name (``rackboot lab`` claims one before it builds)."""
        self.id = lab_id or new_id()
        self.prefix = prefix
        # 10.X.Y.0/24 with X in 64..254 keeps clear of the commonly used 10.0/10.1 ranges.
        taken = {other.network for other in avoid}
        self.network: ipaddress.IPv4Network
        for _ in range(100):
            self.network = ipaddress.IPv4Network(
                f"10.{64 + secrets.randbelow(191)}.{secrets.randbelow(256)}.0/24"
            )
            if self.network not in taken:
                break
        self.bridge_ns = f"{prefix}{self.id}-br"
        self.bridge = f"br-{self.id}"
        self.hosts: dict[str, Host] = {}
        self.namespaces: list[str] = []  # recorded before creation, deleted in reverse
        self.procs: list[subprocess.Popen] = []
        self._lowlat_fd: int | None = None
        self._ports = 0
        self._closed = False
        try:
            self._add_ns(self.bridge_ns)
            # No STP and no forward delay: ports forward at once. No multicast
            # snooping: mDNS floods to every port like on a dumb switch.
            _ip("-n", self.bridge_ns, "link", "add", self.bridge, "type", "bridge",
                "stp_state", "0", "forward_delay", "0", "mcast_snooping", "0")  # fmt: skip
            _ip("-n", self.bridge_ns, "link", "set", self.bridge, "up")
            if lowlat:
                self._hold_low_latency()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_host(
        self, name: str, addr: str | None = None, *, mac: str | None = None, bare: bool = False
    ) -> Host:
        """Add namespace ``name`` on the bridge with ``addr`` (default: the next free address).

        ``addr`` may carry a prefix length; without one the lab's /24 applies.
        ``bare=True``: no address at all (``Host.addr`` is ""), as a DHCP client
        starts. ``mac`` sets the interface's MAC. On failure the half-made host
        is removed at once and the lab stays usable.
        """
        if not (name.isascii() and name.isalnum()) or len(name) > 6 or name in self.hosts:
            raise ValueError(f"host name must be new, alphanumeric, at most 6 chars: {name!r}")
        ns = f"{self.prefix}{self.id}-{name}"
        try:
            self._add_ns(ns)
            host = self._plug(name, ns, addr, mac=mac, bare=bare)
        except BaseException:
            with contextlib.suppress(LabError):  # else close() retries; keep the first error
                self._del_ns(ns)  # takes the veth pair with it
            raise
        self.hosts[name] = host
        return host

    def attach(
        self, host: Host, addr: str | None = None, *, mac: str | None = None, bare: bool = False
    ) -> Host:
        """Give ``host``'s namespace (any lab's) an interface on this lab's bridge too.

        Returns a :class:`Host` for the new interface: same namespace, this lab's
        network; processes started through it stop when this lab closes. The
        interface goes away with this lab's bridge namespace or with the host's.
        """
        if host.name in self.hosts:
            raise ValueError(f"{host.name!r} is already on this lab")
        plugged = self._plug(host.name, host.ns, addr, mac=mac, bare=bare)
        self.hosts[host.name] = plugged
        return plugged

    def _plug(self, name: str, ns: str, addr: str | None, *, mac: str | None, bare: bool) -> Host:
        """A veth from the bridge into ``ns``, addressed unless ``bare``."""
        if addr is None and not bare:
            addr = str(self._next_free())
        cidr = "" if addr is None else addr if "/" in addr else f"{addr}/{self.network.prefixlen}"
        # Port names are never reused: a deleted namespace's veth vanishes asynchronously.
        self._ports += 1
        ifname, brport = f"{name}-{self.id}", f"v{self._ports}-{self.id}"
        assert len(ifname) <= IFNAMSIZ and len(brport) <= IFNAMSIZ
        try:
            _ip("-n", self.bridge_ns, "link", "add", brport, "type", "veth",
                "peer", "name", ifname, "netns", ns)  # fmt: skip
            _ip("-n", self.bridge_ns, "link", "set", brport, "master", self.bridge, "up")
            if mac is not None:
                _ip("-n", ns, "link", "set", ifname, "address", mac)
            if not bare:
                _ip("-n", ns, "addr", "add", cidr, "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
        except BaseException:
            if netns_exists(self.bridge_ns):  # the bridge end takes the pair with it
                with contextlib.suppress(LabError):
                    _ip("-n", self.bridge_ns, "link", "del", brport)
            raise
        if bare:
            return Host(self, name, ns, ifname, "", self.network)
        iface = ipaddress.IPv4Interface(cidr)
        return Host(self, name, ns, ifname, str(iface.ip), iface.network)

    def close(self, term_timeout: float = 5.0, kill_timeout: float = 5.0) -> None:
        """Stop our processes (SIGTERM, then SIGKILL), delete our namespaces. Idempotent.

        Every step runs even when an earlier one fails; failures are raised at the end.
        """
        errors: list[str] = []
        errors += self._stop_procs(term_timeout, kill_timeout)
        for ns in reversed(list(self.namespaces)):
            try:
                self._del_ns(ns)
            except LabError as exc:
                errors.append(str(exc))
        if self._lowlat_fd is not None:
            os.close(self._lowlat_fd)
            self._lowlat_fd = None
        self._closed = True
        if errors:
            raise LabError("lab teardown incomplete: " + "; ".join(errors))

    # -- internals ----------------------------------------------------------

    def _track(self, proc: subprocess.Popen) -> subprocess.Popen:
        if self._closed:
            proc.kill()
            proc.wait(timeout=5)
            raise LabError("lab is closed")
        self.procs.append(proc)
        return proc

    def _stop_procs(self, term_timeout: float, kill_timeout: float) -> list[str]:
        # Only our own Popen objects: Popen never signals a PID it has already reaped.
        for sig, timeout in ((signal.SIGTERM, term_timeout), (signal.SIGKILL, kill_timeout)):
            for p in self.procs:
                if p.poll() is None:
                    p.send_signal(sig)
            deadline = time.monotonic() + timeout
            for p in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
        return [f"pid {p.pid} survived SIGKILL" for p in self.procs if p.poll() is None]

    def _add_ns(self, ns: str) -> None:
        if netns_exists(ns):  # never adopt (and later delete) someone else's namespace
            raise LabError(f"network namespace {ns} already exists")
        self.namespaces.append(ns)  # first: a failure mid-command still gets cleaned up
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def _del_ns(self, ns: str) -> None:
        delete_netns(ns)
        self.namespaces.remove(ns)

    def _next_free(self) -> ipaddress.IPv4Address:
        used = {ipaddress.IPv4Address(h.addr) for h in self.hosts.values() if h.addr}
        for candidate in self.network.hosts():
            if candidate not in used:
                return candidate
        raise LabError(f"no free address left in {self.network}")

    def _hold_low_latency(self) -> None:
        # On this VM a halted vCPU takes ~40-70 us to wake, which slows lock-step
        # protocols 3-4x. A PM QoS request of 0 keeps vCPUs polling while the fd is open.
        try:
            fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
        except OSError:
            return  # not available here: measure without it
        os.write(fd, struct.pack("i", 0))
        self._lowlat_fd = fd
