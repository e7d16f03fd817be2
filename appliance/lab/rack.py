"""A rack in network namespaces: two (or three) appliances (real ``rackboot run`` with
DHCP on the lab link, the election, the VIP) and a witness (``rackboot witness``), for
``rackboot lab``, the HA tests and the benchmarks. Identities are made offline
(appliance/lab/identities.py)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from appliance import control
from appliance.errors import RackbootError
from appliance.lab.identities import enrol_members, node_id
from appliance.lab.netns import Lab
from appliance.lab.node import DhcpNode
from appliance.lab.processes import rackboot, stop_process, wait_until

PORT = 7471
APPLIANCES = ("a", "b", "d")  # "c" is the client host


class HaNode(DhcpNode):
    """A rack appliance: DHCP on the lab link, the election, the VIP."""

    def _ready(self, status: dict) -> bool:
        return "election" in status["core"]["ha"]  # either role: the election is running

    def ha(self) -> dict | None:
        try:
            return control.call(self.socket, "ha.status", timeout=2.0)
        except RackbootError:
            return None

    def active(self) -> bool:
        ha = self.ha()
        return bool(ha and ha["role"] == "active")


class Rack:
    def __init__(self, lab: Lab, tmp_path: Path, *, client_addr: bool = False,
                 dhcp: str = "", disabled: tuple[str, ...] = ("tftp", "httpboot"),
                 appliances: int = 2, cluster_links: bool = False) -> None:  # fmt: skip
        """``client_addr``: the client host gets an address (a relay-style probe needs one);
        ``dhcp``: more ``[dhcp]`` settings, e.g. ``lease_time = 60`` (and after them any
        other section); ``disabled``: the appliances' disabled plugins; ``appliances``:
        2 (``a``, ``b``) or 3 (and ``d``); ``cluster_links``: the appliances link over the
        cluster's TLS too ([cluster] peers: each lists the others; mDNS stays off)."""
        self.dhcp = dhcp
        self.cluster_links = cluster_links
        self.disabled = disabled
        self.lab = lab
        names = APPLIANCES[:appliances]
        self.hosts = {n: lab.add_host(n) for n in (*names, "w")}
        self.client = lab.add_host("c", bare=not client_addr)
        self.vip = str(lab.network.network_address + 200)
        dirs = {n: tmp_path / n / "data" for n in names} | {"w": tmp_path / "w"}
        enrol_members(tmp_path, [*names, "w"], dirs=dirs)
        self.ids = {n: node_id(d) for n, d in dirs.items()}
        self.nodes = {n: self._node(tmp_path, n, names) for n in names}
        self.witness_config = tmp_path / "w.toml"
        self.witness_config.write_text(
            f'[node]\nname = "w"\ndata_dir = "{dirs["w"]}"\n'
            f'[ha]\nlisten = "{self.hosts["w"].addr}"\nport = {PORT}\n'
        )
        self.witness_log = tmp_path / "w.log"
        self.witness: subprocess.Popen | None = None

    def address(self, name: str) -> str:
        return f"{self.hosts[name].addr}:{PORT}"

    def member(self, name: str) -> str:
        """How ``[ha] peers`` and ``witnesses`` name a member: its node id and address."""
        return f"{self.ids[name]}@{self.address(name)}"

    def _node(self, tmp_path: Path, name: str, names: tuple[str, ...]) -> HaNode:
        host = self.hosts[name]
        peers = ", ".join(f'"{self.member(other)}"' for other in names if other != name)
        links = ", ".join(f'"{self.hosts[other].addr}:7470"' for other in names if other != name)
        net = self.lab.network
        return HaNode(
            host,
            tmp_path / name,
            self.dhcp
            + f"""
            [[dhcp.subnets]]
            network = "{net}"
            pools = ["{net.network_address + 100}-{net.network_address + 150}"]
            router = "{net.network_address + 1}"

            [cluster]
            listen = "{host.addr}"
            port = 7470
            mdns = false
            peers = [{links if self.cluster_links else ""}]

            [ha]
            listen = "{host.addr}"
            port = {PORT}
            peers = [{peers}]
            witnesses = ["{self.member("w")}"]
            vip = "{self.vip}/{net.prefixlen}"
            vip_interface = "{host.ifname}"
            """,
            name=name,
            disabled=self.disabled,
        )

    def start(self) -> Rack:
        with self.witness_log.open("w") as out:
            self.witness = self.hosts["w"].popen(
                rackboot("witness", "--config", str(self.witness_config)),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        for node in self.nodes.values():
            node.start(timeout=60)
        wait_until(lambda: len(self.actives()) == 1, 20, "one active", detail=self.logs)
        wait_until(self.settled, 10, "the standbys counted by the active", detail=self.logs)
        return self

    def settled(self) -> bool:
        """One active whose standbys follow it with everything it wrote (its announcement
        of its server identifiers included) and are not declared ineligible: only then may
        a standby take over (docs/state.md, the commit rule)."""
        actives = self.actives()
        if len(actives) != 1:
            return False
        node = self.nodes[actives[0]]
        # The follower's view first, the acceptors' second: a standby counted again for
        # commits is still declared until the acceptors granted a round without it, and
        # the two reads in the other order could each catch a different half of that.
        status = node.status()
        ha = node.ha()
        state = status["core"]["state"]
        followers = state.get("replication", {}).get("followers", {})
        return bool(
            ha
            and "election" in ha
            and not ha["election"].get("ineligible")
            and not ha["election"].get("declaring")
            and state["lsn"] >= 1
            and len(followers) == len(self.nodes) - 1
            and all(f["counted"] and f["lag"] == 0 for f in followers.values())
        )

    def actives(self) -> list[str]:
        return [n for n, node in self.nodes.items() if node.active()]

    def has_vip(self, name: str) -> bool:
        host = self.hosts[name]
        out = host.run(["ip", "-4", "-o", "addr", "show", "dev", host.ifname]).stdout
        return f" {self.vip}/" in out

    def cut(self, a: str, b: str) -> None:
        """No unicast between ``a`` and ``b`` (both ways) from now on."""
        for x, y in ((a, b), (b, a)):
            self.hosts[x].run(["ip", "route", "add", "blackhole", f"{self.hosts[y].addr}/32"],
                              check=True)  # fmt: skip

    def logs(self) -> str:
        texts = [f"--- {n}\n{node.log_text()[-3000:]}" for n, node in self.nodes.items()]
        if self.witness_log.exists():
            texts.append(f"--- w\n{self.witness_log.read_text()[-2000:]}")
        return "\n".join(texts)

    def close(self) -> None:
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                stop_process(node.proc, signal.SIGTERM, 10)
        if self.witness is not None and self.witness.poll() is None:
            stop_process(self.witness, signal.SIGTERM, 10)
