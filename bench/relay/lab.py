"""The relay benchmark's lab, its DHCP server and the two relays under test.

::

    [cli] perfdhcp 10.X.0.2/16 --- client link --- 10.X.0.1/16 [rly] U.1 --- upstream --- U.2 [srv] Kea

The relay namespace ``rly`` is a router (tests/support/relay_lab.py's :class:`Router`,
made here with a /16 client link so that 50,000 clients fit one pool); nothing is IP
forwarded, so every DHCP message crosses through the relay under test. Kea is
bench.dhcp's (memfile, raw sockets, one subnet: the client link's /16, router = the
relay's client-side address), with a route back to the client link via the relay.
The relays are ``bench.dhcp.servers.Server`` s (started fresh per run, pinned with
taskset, CPU time from /proc): Rackboot's (``rackboot run``, only the relay plugin,
the configuration of relay_lab's :class:`RelayNode`) and ISC dhcrelay (relay_lab's
:class:`Dhcrelay` command line, with ``-a``: option 82 with the interface's name as
circuit-id, as Rackboot adds by default).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from appliance.lab.node import NodeExited
from bench.dhcp.servers import REPO, Kea, Server, ServerUnavailable, Subnet
from bench.relay import wire
from tests.support.netns import Host, Lab
from tests.support.relay_lab import Dhcrelay, RelayNode, Router, udp_listening

PROBE_WAIT = 3.0  # one probe attempt (it retransmits every 0.5 s within it)


class RelayLab:
    """Two labs: the client link (a /16) and the upstream link, the relay on both."""

    def __init__(self) -> None:
        self.labs: list[Lab] = []
        try:
            self.upstream = self._lab("rbu")
            for _ in range(20):  # the client /16 must not contain the upstream /24
                link = self._lab("rbc", avoid=(self.upstream,))
                second = link.network.network_address.packed[1]
                if second != self.upstream.network.network_address.packed[1]:
                    break
            else:
                raise RuntimeError("no client /16 clear of the upstream link in 20 tries")
            self.link = link
            self.subnet = Subnet.for_second_octet(second)
            s, plen = self.subnet, self.subnet.network.prefixlen
            self.rly = self.upstream.add_host("rly")
            self.down = link.attach(self.rly, f"{s.server}/{plen}")  # giaddr, router
            self.srv = self.upstream.add_host("srv")
            self.cli = link.add_host("cli", f"{s.client}/{plen}")
            self.router = Router(self.upstream, self.rly, [link], [self.down])
            self.srv.run(["ip", "route", "add", str(s.network), "via", self.rly.addr], check=True)
        except BaseException:
            self.close()
            raise

    def _lab(self, prefix: str, avoid: tuple[Lab, ...] = ()) -> Lab:
        lab = Lab(prefix=prefix, avoid=avoid)
        self.labs.append(lab)
        return lab

    @property
    def namespaces(self) -> list[str]:
        return [ns for lab in self.labs for ns in lab.namespaces]

    def steer_replies(self) -> None:
        """The client-side nftables rule (bench/relay/wire.py): replies reach perfdhcp."""
        rules = wire.nft_rules(self.cli.ifname, self.cli.addr)
        res = self.cli.run(["nft", "-f", "-"], input=rules)
        if res.returncode != 0:
            raise RuntimeError(f"nft in the client namespace: {res.stderr.strip()}")

    def close(self) -> None:
        errors = []
        for lab in reversed(self.labs):
            try:
                lab.close()
            except Exception as exc:  # noqa: BLE001 - close every lab, report all
                errors.append(str(exc))
        if errors:
            raise RuntimeError("; ".join(errors))


class UpstreamKea(Kea):
    """bench.dhcp's Kea on the upstream link; ready once it listens on port 67. Its
    DORA probe would act as a relay; the probe through the relay replaces it."""

    def wait_started(self, srv: Host, deadline: float) -> None:
        while not udp_listening(srv):
            self.check_alive()
            if time.monotonic() > deadline:
                raise ServerUnavailable("kea-dhcp4 not listening on port 67", self.log)
            time.sleep(0.05)

    def probe(self, cli: Host, deadline: float) -> None:
        pass


class Relay(Server):
    """A relay under test, in the relay namespace; ``probe`` is a DORA through it."""

    ready_timeout = 30.0

    def __init__(self, workdir: Path, lab: RelayLab, cpu: str, options: dict[str, Any]) -> None:
        super().__init__(workdir, lab.subnet, cpu, options)
        self.lab = lab

    def probe(self, cli: Host, deadline: float) -> None:
        argv = [sys.executable, "-m", "bench.relay.wire", "probe", cli.addr, str(PROBE_WAIT)]
        if self.options.get("broadcast"):
            argv.append("--broadcast")
        last = ""
        for _ in range(20):
            self.check_alive()
            res = cli.run(argv, timeout=PROBE_WAIT + 10, env=self.env(), cwd=REPO)
            last = ((res.stdout + res.stderr).strip().splitlines() or [f"exit {res.returncode}"])[
                -1
            ]
            if res.returncode == 0:
                self.probe_result = last
                return
            if time.monotonic() > deadline:
                break
        raise ServerUnavailable(
            f"no DORA through {self.name} within {self.ready_timeout:.0f} s (last probe: {last})",
            self.log,
        )

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PYTHONPATH"] = str(REPO)
        return env

    def system_seconds(self) -> float | None:
        """The kernel's share of :meth:`cpu_seconds` (stime): socket calls, and on these
        veths the receiving side's softirq work too, which runs in the sender's context."""
        if self.proc is None:
            return None
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return None
        return int(stat[stat.rfind(")") + 2 :].split()[12]) / os.sysconf("SC_CLK_TCK")

    def log_since_start(self) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return text[text.rfind("\n=== start ") + 1 :]


class RackbootRelay(Relay):
    """``rackboot run`` with only the relay plugin (relay_lab's RelayNode configuration:
    one ``[[relay.interfaces]]``, the client link; ``servers`` = Kea), at log level warning."""

    name = "rackboot"
    profilable = True
    SHELL_COUNTERS = ("send_errors", "arp_refused")

    def __init__(self, workdir: Path, lab: RelayLab, cpu: str, options: dict[str, Any]) -> None:
        super().__init__(workdir, lab, cpu, options)
        self.node = RelayNode(lab.router, self.dir, [lab.srv.addr])  # writes rackboot.toml
        self.counters_before: dict[str, Any] = {}

    def reset_state(self) -> None:
        import shutil

        shutil.rmtree(self.node.data, ignore_errors=True)

    def argv(self, srv: Host) -> list[str]:
        return [sys.executable, "-m", "appliance", "--log-level", "warning",
                "run", "--config", str(self.node.config)]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {**super().env(), "XDG_DATA_HOME": str(self.dir / "xdg")}

    def wait_started(self, srv: Host, deadline: float) -> None:
        self.node.proc = self.proc
        while True:
            try:
                if self.node._serving():  # relay.relaying in status
                    return
            except NodeExited as exc:
                raise ServerUnavailable(str(exc).splitlines()[0], self.log) from None
            if time.monotonic() > deadline:
                raise ServerUnavailable("rackboot relay not relaying (status)", self.log)
            time.sleep(0.1)

    def _counters(self) -> dict[str, Any]:
        try:
            status = self.node.relay_status()
        except Exception:  # noqa: BLE001 - a node that does not answer has no counters
            return {}
        ifaces = status.get("interfaces", {})
        return {
            "requests": sum(i.get("requests", 0) for i in ifaces.values()),
            "replies": sum(i.get("replies", 0) for i in ifaces.values()),
            "dropped": dict(status.get("dropped", {})),
            # the shell's failures: sendto/sendmsg errors, ARP entries the kernel refused
            **{k: status[k] for k in self.SHELL_COUNTERS if isinstance(status.get(k), int)},
        }

    def load_started(self) -> None:
        self.counters_before = self._counters()

    def after_run(self, srv: Host) -> dict[str, Any]:
        """The relay's own counters over the run: requests forwarded, replies delivered,
        drops by reason (status ``relay``)."""
        after, before = self._counters(), self.counters_before
        if not after:
            return {}
        dropped = {
            k: n - before.get("dropped", {}).get(k, 0)
            for k, n in after["dropped"].items()
            if n - before.get("dropped", {}).get(k, 0)
        }
        out = {
            "requests": after["requests"] - before.get("requests", 0),
            "replies": after["replies"] - before.get("replies", 0),
            "dropped": dropped,
        }
        for key in self.SHELL_COUNTERS:
            if key in after and after[key] - before.get(key, 0):
                out[key] = after[key] - before.get(key, 0)
        return out


class IscDhcrelay(Relay):
    """ISC dhcrelay in the foreground (``-d``, as relay_lab runs it) with ``-a``.

    In the foreground dhcrelay writes a line per forwarded message to stderr (our log
    file) and tries syslog (no /dev/log here): part of its measured CPU."""

    name = "dhcrelay"
    READY = "Sending on   Socket/fallback"
    _FORWARDED = re.compile(r"^Forwarded (BOOTREQUEST|BOOTREPLY) ", re.M)

    def __init__(self, workdir: Path, lab: RelayLab, cpu: str, options: dict[str, Any]) -> None:
        super().__init__(workdir, lab, cpu, options)
        self.isc = Dhcrelay(lab.router, self.dir, [lab.srv.addr], flags=("-a",))
        self.offset = 0

    def reset_state(self) -> None:
        (self.dir / "dhcrelay.pid").unlink(missing_ok=True)

    def argv(self, srv: Host) -> list[str]:
        return self.isc.argv

    def wait_started(self, srv: Host, deadline: float) -> None:
        while self.READY not in self.log_since_start():
            self.check_alive()
            if time.monotonic() > deadline:
                raise ServerUnavailable("dhcrelay never said it was listening", self.log)
            time.sleep(0.05)

    def load_started(self) -> None:
        with contextlib.suppress(OSError):
            self.offset = self.log.stat().st_size

    def after_run(self, srv: Host) -> dict[str, Any]:
        """Its log lines over the run: requests forwarded, replies forwarded."""
        try:
            with self.log.open("rb") as f:
                f.seek(self.offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return {}
        kinds = self._FORWARDED.findall(text)
        return {"requests": kinds.count("BOOTREQUEST"), "replies": kinds.count("BOOTREPLY")}


RELAYS: dict[str, type[Relay]] = {"dhcrelay": IscDhcrelay, "rackboot": RackbootRelay}
