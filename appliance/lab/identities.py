"""Cluster identities made offline for a lab rack: one member creates the cluster and
enrols the others through the same authority functions a join goes through, without
the network (the lab's appliances then authenticate each other as a real rack does)."""

from __future__ import annotations

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
