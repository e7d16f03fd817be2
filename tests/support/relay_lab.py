"""A router topology for the DHCP relay tests: client links behind a relay namespace.

::

    [srv] U.x --- upstream link --- U.y [rly] L1.1 --- link 1 --- [cli] (no address)
                                            L2.1 --- link 2 --- [cli]
                                            L3.1 --- link 3 --- [cli]

The relay namespace is on every link (:meth:`Lab.attach`); its address on a client
link (``.1``) is that link's ``giaddr`` and router. Servers reach the client links
through a route via the relay's upstream address (:func:`route_via`); nothing is
IP-forwarded unless a test asks for it (:func:`forward`), so a DHCP message crosses
only through the relay agent under test:

* :class:`RelayNode`: Rackboot's relay, a ``rackboot run`` with only the ``relay``
  plugin (``[relay]``, docs/relay.md);
* :class:`Dhcrelay`: ISC ``dhcrelay``, the known-good relay the lab was checked with;
* :class:`Kea`, :class:`Dnsmasq`: third-party DHCP servers with one subnet per client
  link (Rackboot's own server is :class:`~tests.support.dhcplab.DhcpNode` with
  :func:`subnets_toml`).

Hostile replies are built with scapy (:func:`bootreply`) and sent from a lab host by
this module run as ``python -m tests.support.relay_lab send SRC DST HEX`` (a UDP
datagram from SRC:67, as a server's reply leaves, to DST:67). What reaches a UDP
socket in a namespace is counted by ``python -m tests.support.relay_lab listen PORT
FILE`` (:class:`Listener`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import select
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from appliance import control
from appliance.errors import RackbootError
from tests.support.dhcplab import REPO, DhcpNode, Udhcpc, stop_process, wait_until
from tests.support.netns import Host, Lab

POOL = (100, 150)  # offsets of every client link's pool in its /24
SERVER_PORT = 67


@dataclass
class Router:
    upstream: Lab
    up: Host  # the relay namespace's interface on the upstream link
    links: list[Lab]  # the client links
    downs: list[Host]  # its interface on each client link: the link's giaddr

    def pool(self, link: int) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
        base = self.links[link].network.network_address
        return base + POOL[0], base + POOL[1]

    def in_pool(self, link: int, address: str) -> bool:
        first, last = self.pool(link)
        return first <= ipaddress.IPv4Address(address) <= last


def build_router(upstream: Lab, stack: contextlib.ExitStack, links: int = 3) -> Router:
    """The relay namespace ``rly`` on ``upstream`` and on ``links`` new client links
    (labs entered on ``stack``, closed with it)."""
    up = upstream.add_host("rly")
    made: list[Lab] = []
    downs: list[Host] = []
    for _ in range(links):
        link = stack.enter_context(Lab(avoid=(upstream, *made)))
        made.append(link)
        downs.append(link.attach(up))  # the first host of its link: address .1
    return Router(upstream, up, made, downs)


def route_via(router: Router, *hosts: Host) -> None:
    """Routes to every client link via the relay, in each host's namespace (a server's
    replies go to the ``giaddr``)."""
    for host in hosts:
        for link in router.links:
            host.run(["ip", "route", "add", str(link.network), "via", router.up.addr], check=True)


def forward(router: Router, client: Host, link: int) -> None:
    """IP forwarding in the relay namespace and a route from ``client`` (on ``link``)
    to the upstream link: for traffic after DHCP (HTTP boot)."""
    router.up.run(["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"], check=True)
    client.run(["ip", "route", "add", str(router.upstream.network), "via",
                router.downs[link].addr], check=True)  # fmt: skip


def subnets_toml(router: Router) -> str:
    """Rackboot's ``[[dhcp.subnets]]``: one per client link, its pool, the relay as router."""
    out = []
    for i, link in enumerate(router.links):
        first, last = router.pool(i)
        out.append(
            f'[[dhcp.subnets]]\nnetwork = "{link.network}"\npools = ["{first}-{last}"]\n'
            f'router = "{router.downs[i].addr}"\n'
        )
    return "".join(out)


def start_clients(router: Router, workdir: Path, name: str = "cli") -> list[Udhcpc]:
    """A bare host named ``name`` on every client link, running udhcpc; in link order."""
    clients = []
    for i, link in enumerate(router.links):
        host = link.add_host(name, bare=True)
        clients.append(Udhcpc(host, workdir / f"{name}{i}").start())
    return clients


def assert_bound_in_their_subnets(
    router: Router, clients: list[Udhcpc], timeout: float
) -> list[str]:
    """Each client's ``bound`` (waited for in turn: they run at once), from its own link's
    pool; the addresses, in link order."""
    addresses = []
    for i, client in enumerate(clients):
        got = client.wait("bound", timeout)
        assert router.in_pool(i, got["ip"]), (
            f"link {i} ({router.links[i].network}): bound {got['ip']}, not from its pool"
        )
        addresses.append(got["ip"])
    return addresses


def udp_listening(host: Host, port: int = SERVER_PORT) -> bool:
    """Something in ``host``'s namespace has a UDP socket on ``port``."""
    res = host.run(["ss", "-H", "-uln", f"sport = :{port}"])
    return res.returncode == 0 and bool(res.stdout.strip())


# -- relays ----------------------------------------------------------------------------


class RelayNode(DhcpNode):
    """``rackboot run`` in the relay namespace with only the relay plugin; ``relay``: more
    ``[relay]`` keys (TOML lines), ``interface``: more keys of every ``[[relay.interfaces]]``.

    DhcpNode's process handling (start, stop, kill9, control calls, CLI) is reused; its
    configuration file is replaced by the relay's and "serving" means relaying."""

    def __init__(self, router: Router, workdir: Path, servers: list[str], *,
                 relay: str = "", interface: str = "") -> None:  # fmt: skip
        super().__init__(router.up, workdir, "", name="relay",
                         disabled=("dhcp", "tftp", "httpboot"))  # fmt: skip
        interfaces = "".join(
            f'[[relay.interfaces]]\nname = "{down.ifname}"\n{interface}' for down in router.downs
        )
        self.config.write_text(
            f'[node]\nname = "relay"\ndata_dir = "{self.data}"\nshutdown_grace = 2.0\n\n'
            '[plugins]\ndisabled = ["dhcp", "tftp", "httpboot"]\n\n'
            f"[relay]\nservers = {json.dumps(servers)}\n{relay}\n{interfaces}"
        )

    def _serving(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"relay exited {self.proc.returncode}:\n{self.log_text()}")
        try:
            status = control.call(self.socket, "status", timeout=2.0)
        except RackbootError:
            return False
        return bool(status.get("relay", {}).get("relaying"))

    def check(self) -> None:
        """``rackboot config check`` accepts the file."""
        res = self.host.run(
            [sys.executable, "-m", "appliance", "config", "check", str(self.config)],
            timeout=20, cwd=REPO,
        )  # fmt: skip
        assert res.returncode == 0, f"config check: {res.stdout}{res.stderr}"

    def relay_status(self) -> dict:
        return self.status()["relay"]

    def dropped(self) -> dict[str, int]:
        return self.relay_status().get("dropped", {})


class Dhcrelay:
    """ISC dhcrelay on the router: every client link down, the upstream link up.
    ``flags``: more options, e.g. ``-a`` (add option 82, circuit id = the interface's
    name) and ``-D`` (drop replies whose option 82 is not its own)."""

    def __init__(self, router: Router, workdir: Path, servers: list[str], *,
                 flags: tuple[str, ...] = ()) -> None:  # fmt: skip
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "dhcrelay.log"
        downs = [arg for down in router.downs for arg in ("-id", down.ifname)]
        self.argv = ["dhcrelay", "-4", "-d", *flags, "-pf", str(workdir / "dhcrelay.pid"),
                     *downs, "-iu", router.up.ifname, *servers]  # fmt: skip
        self.host = router.up
        self.proc: subprocess.Popen | None = None

    def start(self) -> Dhcrelay:
        with self.log.open("w") as out:
            self.proc = self.host.popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)  # fmt: skip
        wait_until(lambda: "Sending on   Socket/fallback" in self.log.read_text(), 10,
                   "dhcrelay listening", detail=self.log.read_text)  # fmt: skip
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


# -- third-party servers -----------------------------------------------------------------


class _Server:
    """A DHCP server process in ``host``'s namespace with its files under ``workdir``."""

    name = "?"

    def __init__(self, host: Host, workdir: Path, router: Router) -> None:
        self.host = host
        self.dir = workdir / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.router = router
        self.log = self.dir / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 10.0) -> _Server:
        with self.log.open("w") as out:
            self.proc = self.host.popen(self.argv(), stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=self.env(), cwd=self.dir)  # fmt: skip

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited {self.proc.returncode}: {self.log_text()}"
                )
            return udp_listening(self.host)

        wait_until(up, timeout, f"{self.name} on port {SERVER_PORT}", detail=self.log_text)
        return self

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("*.log")))

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


class Kea(_Server):
    """kea-dhcp4 (memfile) with one subnet per client link, chosen by ``giaddr``."""

    name = "kea"

    def argv(self) -> list[str]:
        subnets = []
        for i, link in enumerate(self.router.links):
            first, last = self.router.pool(i)
            subnets.append({
                "id": i + 1,
                "subnet": str(link.network),
                "pools": [{"pool": f"{first} - {last}"}],
                "option-data": [{"name": "routers", "data": self.router.downs[i].addr}],
            })  # fmt: skip
        config = {
            "Dhcp4": {
                # UDP sockets: relayed requests are unicast to the server's address
                "interfaces-config": {"interfaces": [self.host.ifname], "dhcp-socket-type": "udp"},
                "lease-database": {"type": "memfile", "persist": True,
                                   "name": str(self.dir / "leases4.csv"), "lfc-interval": 0},
                "valid-lifetime": 600,
                "subnet4": subnets,
                "loggers": [{"name": "kea-dhcp4", "severity": "INFO",
                             "output_options": [{"output": str(self.dir / "kea-dhcp4.log")}]}],
            }
        }  # fmt: skip
        path = self.dir / "kea-dhcp4.json"
        path.write_text(json.dumps(config, indent=2))
        return ["kea-dhcp4", "-c", str(path)]

    def env(self) -> dict[str, str]:
        # Our own pid and lock files, never the system instance's /run/kea (bench/dhcp does so too).
        return {**os.environ, "KEA_PIDFILE_DIR": str(self.dir), "KEA_LOCKFILE_DIR": str(self.dir)}


class Dnsmasq(_Server):
    """dnsmasq as a DHCP server only (``port=0``), a ``dhcp-range`` per client link."""

    name = "dnsmasq"

    def argv(self) -> list[str]:
        lines = ["port=0", f"interface={self.host.ifname}", "bind-interfaces", "no-resolv",
                 "no-hosts", "dhcp-authoritative", "no-ping", "log-dhcp", "user=root",
                 f"dhcp-leasefile={self.dir / 'dnsmasq.leases'}",
                 f"pid-file={self.dir / 'dnsmasq.pid'}",
                 f"log-facility={self.dir / 'dnsmasq-daemon.log'}"]  # fmt: skip
        for i, link in enumerate(self.router.links):
            first, last = self.router.pool(i)
            lines += [f"dhcp-range=set:l{i},{first},{last},{link.network.netmask},600",
                      f"dhcp-option=tag:l{i},option:router,{self.router.downs[i].addr}"]  # fmt: skip
        path = self.dir / "dnsmasq.conf"
        path.write_text("\n".join(lines) + "\n")
        return ["dnsmasq", "--keep-in-foreground", f"--conf-file={path}"]


SERVERS = {"kea": (Kea, "kea-dhcp4"), "dnsmasq": (Dnsmasq, "dnsmasq")}  # class, program


# -- hostile replies -----------------------------------------------------------------------


def bootreply(*, xid: int, chaddr: str, yiaddr: str, giaddr: str, circuit_id: str,
              server: str) -> bytes:  # fmt: skip
    """A DHCPOFFER as a server sends it to a relay: broadcast flag set (so the relay would
    broadcast it on the client link), option 82 with ``circuit_id`` as sub-option 1."""
    from scapy.layers.dhcp import BOOTP, DHCP  # the oracle: imported only where used

    circuit = circuit_id.encode()
    return bytes(
        BOOTP(op=2, xid=xid, flags=0x8000, yiaddr=yiaddr, giaddr=giaddr, siaddr=server,
              chaddr=bytes.fromhex(chaddr.replace(":", "")) + bytes(10))
        / DHCP(options=[("message-type", "offer"), ("server_id", server),
                        ("lease_time", 600), ("subnet_mask", "255.255.255.0"),
                        ("relay_agent_information", bytes([1, len(circuit)]) + circuit), "end"])
    )  # fmt: skip


def send_reply(host: Host, src: str, dst: str, payload: bytes) -> None:
    """``payload`` as one UDP datagram from ``src``:67 to ``dst``:67, sent from ``host``'s
    namespace (by this module's ``send``)."""
    res = host.run([sys.executable, "-m", "tests.support.relay_lab", "send", src, dst,
                    payload.hex()], cwd=REPO, timeout=20)  # fmt: skip
    assert res.returncode == 0, f"send from {src}: {res.stdout}{res.stderr}"


def _send(src: str, dst: str, payload_hex: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((src, SERVER_PORT))
        sock.sendto(bytes.fromhex(payload_hex), (dst, SERVER_PORT))


class Listener:
    """A UDP socket on ``0.0.0.0:port`` in ``host``'s namespace, by this module's ``listen``:
    a line per datagram it receives (a broadcast the kernel loops back to local sockets
    reaches it too; a frame sent through a packet socket does not)."""

    def __init__(self, host: Host, workdir: Path, port: int = 68) -> None:
        self.out = workdir / f"listen-{host.name}-{port}.txt"
        self.proc = host.popen(
            [sys.executable, "-m", "tests.support.relay_lab", "listen", str(port), str(self.out)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=REPO,
        )  # fmt: skip
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 15.0)
        assert ready and self.proc.stdout.readline().strip() == "ready", "listener did not start"

    def received(self) -> list[str]:
        """``SOURCE_ADDRESS PAYLOAD_HEX`` per datagram so far."""
        return self.out.read_text().splitlines() if self.out.exists() else []

    def stop(self) -> list[str]:
        stop_process(self.proc)
        return self.received()


def _listen(port: str, out_path: str) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock, open(out_path, "a") as out:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.bind(("0.0.0.0", int(port)))
        print("ready", flush=True)
        while True:
            data, (source, _port) = sock.recvfrom(65_535)
            out.write(f"{source} {data.hex()}\n")
            out.flush()


USAGE = "usage: python -m tests.support.relay_lab send SRC DST PAYLOAD_HEX | listen PORT FILE"

if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "send":
        _send(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "listen":
        _listen(*sys.argv[2:])
    else:
        raise SystemExit(USAGE)
