"""The cluster identity on disk, under ``<data_dir>/cluster/`` (directory 0700).

=================  ======  ==============================================
file               mode    what
=================  ======  ==============================================
``node.key``       0600    this node's Ed25519 private key (never leaves it)
``node.crt``       0644    this node's certificate, issued by the CA
``ca.crt``         0644    the cluster CA certificate (the trust anchor)
``crl.der``        0644    the newest revocation list signed by the CA
``cluster.json``   0644    cluster id, node id, CA fingerprint
``ca.key``         0600    the CA private key: only on the node that ran ``init``
``tokens.json``    0600    outstanding join tokens (hashed secrets): CA holder
``members.json``   0644    certificates issued (node id, name, serial): CA holder
=================  ======  ==============================================

Every write is atomic (a temporary file created with the final mode,
fsynced, renamed over the old one, directory fsynced). Blocking: call
from a worker thread in trio code.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from appliance.cluster import pki
from appliance.durable import fsync_directory
from appliance.errors import RackbootError

PRIVATE = 0o600
PUBLIC = 0o644


def write_atomically(final: Path, data: bytes, mode: int) -> None:
    """A temporary file with its final mode, fsynced, renamed over ``final``, the
    directory fsynced: after a crash the file is whole, old or new."""
    final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is masked by the umask; this is not
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    fsync_directory(final.parent)


class ClusterStateError(RackbootError):
    """Cluster files missing, unreadable or inconsistent."""


@dataclass(frozen=True)
class Identity:
    """What a member needs to talk to its peers."""

    cluster_id: str
    node_id: str
    ca: x509.Certificate
    cert: x509.Certificate
    key: Ed25519PrivateKey
    revocations: pki.Revocations
    cert_path: Path
    key_path: Path
    is_ca: bool
    seeds: tuple[str, ...] = ()  # the member that enrolled us: dialled like a static peer

    @property
    def ca_fingerprint(self) -> str:
        return pki.fingerprint(self.ca)

    @property
    def short_fingerprint(self) -> str:
        return self.ca_fingerprint[:16]

    @property
    def ca_pem(self) -> str:
        return pki.cert_pem(self.ca).decode()


class ClusterFiles:
    def __init__(self, data_dir: str | os.PathLike) -> None:
        self.dir = Path(data_dir) / "cluster"

    def path(self, name: str) -> Path:
        return self.dir / name

    def exists(self, name: str) -> bool:
        return self.path(name).exists()

    def enrolled(self) -> bool:
        return all(self.exists(n) for n in ("node.key", "node.crt", "ca.crt", "cluster.json"))

    def is_ca(self) -> bool:
        return self.exists("ca.key")

    def read(self, name: str) -> bytes:
        try:
            return self.path(name).read_bytes()
        except OSError as exc:
            raise ClusterStateError(f"cannot read {self.path(name)}: {exc.strerror}") from None

    def read_json(self, name: str, default: Any = None) -> Any:
        if not self.exists(name):
            return default
        try:
            return json.loads(self.read(name))
        except ValueError:
            raise ClusterStateError(f"{self.path(name)} is not valid JSON") from None

    def write(self, name: str, data: bytes, mode: int) -> None:
        write_atomically(self.dir / name, data, mode)

    def write_json(self, name: str, data: Any, mode: int) -> None:
        self.write(name, json.dumps(data, indent=1, sort_keys=True).encode() + b"\n", mode)

    def load(self, now: dt.datetime) -> Identity:
        """The member identity; :class:`ClusterStateError` naming what is wrong."""
        if not self.enrolled():
            raise ClusterStateError(
                f"this node has no cluster identity in {self.dir} "
                "(run `rackboot cluster init` or `rackboot cluster join TOKEN`)"
            )
        for name in ("node.key", "ca.key"):
            if self.exists(name) and self.path(name).stat().st_mode & 0o077:
                raise ClusterStateError(
                    f"{self.path(name)} is readable by others; chmod 600 it (a leaked key "
                    "lets anyone impersonate this node)"
                )
        try:
            ca = x509.load_pem_x509_certificate(self.read("ca.crt"))
            cert = x509.load_pem_x509_certificate(self.read("node.crt"))
            key = pki.key_from_pem(self.read("node.key"))
            crl = (
                pki.crl_from_der_untrusted(self.read("crl.der"), ca)
                if self.exists("crl.der")
                else pki.Revocations(0, frozenset(), b"")
            )
            who = pki.check_node_cert_untrusted(pki.cert_der(cert), ca, frozenset(), now)
        except (ValueError, pki.CertificateRefused) as exc:
            raise ClusterStateError(f"cluster files in {self.dir} are not usable: {exc}") from None
        if cert.public_key() != key.public_key():
            raise ClusterStateError(f"{self.path('node.crt')} does not match node.key")
        return Identity(
            cluster_id=who.cluster_id,
            node_id=who.node_id,
            ca=ca,
            cert=cert,
            key=key,
            revocations=crl,
            cert_path=self.path("node.crt"),
            key_path=self.path("node.key"),
            is_ca=self.is_ca(),
            seeds=tuple(str(a) for a in self.read_json("cluster.json", {}).get("seeds", [])[:8]),
        )
