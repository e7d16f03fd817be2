"""Cluster identities made offline for HA tests: one CA holder enrols the others."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

from appliance.cluster import authority, pki
from appliance.cluster.files import ClusterFiles


def enrol_members(
    base: Path, names: list[str], rack: str = "rack1", dirs: dict[str, Path] | None = None
) -> dict[str, Path]:
    """Data directories (``base/<name>`` unless ``dirs`` names them), each with a member
    identity of one new cluster."""
    now = time.time()
    dirs = dirs or {name: base / name for name in names}
    first = ClusterFiles(dirs[names[0]])
    authority.init_cluster(first, names[0], now)
    ca_der = first.read("ca.crt")
    ca_der = pki.cert_der(pki.x509.load_pem_x509_certificate(ca_der))
    for name in names[1:]:
        token = authority.issue_token(first, ["127.0.0.1:1"], 600, now)
        key = pki.new_key()
        request = {
            "token": token.token_id, "secret": token.secret, "name": name, "rack": rack,
            "csr": pki.csr_der(pki.make_csr(key, name)),
        }  # fmt: skip
        done = authority.enrol(first, request, now)
        authority.adopt_enrolment(
            ClusterFiles(dirs[name]), pki.key_to_pem(key), ca_der, done.cert_der, done.crl_der, now
        )
    return dirs


def node_id(data_dir: Path) -> str:
    return ClusterFiles(data_dir).read_json("cluster.json", {})["node_id"]


_EPHEMERAL_BELOW = (20000, 32768)  # Linux's ephemeral ports start at 32768 by default


def free_udp_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """UDP ports free now whose TCP port one up is free too (replication listens there),
    below the ephemeral range: an outgoing connection of the test itself (a peer link,
    a replication client) is never given one of them, so a node restarted on its old
    ports finds them free. Another process could still take one: tests retry nothing."""
    low, high = _EPHEMERAL_BELOW
    rng = random.Random()
    found: list[int] = []
    for _ in range(1000):
        port = rng.randrange(low, high - 1)
        if port in found or port + 1 in found or port - 1 in found:
            continue
        if _free(host, port, socket.SOCK_DGRAM) and _free(host, port + 1, socket.SOCK_STREAM):
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError(f"no {count} free port pairs between {low} and {high}")


def _free(host: str, port: int, kind: int) -> bool:
    with socket.socket(socket.AF_INET, kind) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
