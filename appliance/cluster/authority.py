"""What a CA holder does: create the cluster, issue tokens, enrol nodes, revoke them.

The CA key lives on the node that ran ``rackboot cluster init`` (mode 0600,
``<data_dir>/cluster/ca.key``) and nowhere else: only that node issues join
tokens, enrols and revokes. Other members hold the CA *certificate* (to
verify peers) and the newest signed revocation list. Blocking file I/O:
call from a worker thread in trio code.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from appliance.cluster import pki
from appliance.cluster.files import PRIVATE, PUBLIC, ClusterFiles, ClusterStateError, Identity
from appliance.cluster.jointoken import Token, TokenBook, TokenError
from appliance.errors import RackbootError


class EnrolRefused(RackbootError):
    """An enrolment request this CA holder refuses; the text goes back to the requester."""


class NotCaHolder(RackbootError):
    pass


def _write_member_identity(
    files: ClusterFiles, key_pem: bytes, cert: x509.Certificate, ca: x509.Certificate,
    crl_der: bytes, node_id: str, seeds: tuple[str, ...] = (),
) -> None:  # fmt: skip
    files.write("node.key", key_pem, PRIVATE)
    files.write("ca.crt", pki.cert_pem(ca), PUBLIC)
    files.write("crl.der", crl_der, PUBLIC)
    files.write("node.crt", pki.cert_pem(cert), PUBLIC)
    files.write_json(
        "cluster.json",
        {
            "cluster_id": pki.ca_cluster_id(ca),
            "node_id": node_id,
            "ca_sha256": pki.fingerprint(ca),
            "seeds": list(seeds),
        },
        PUBLIC,
    )


def refuse_if_member(files: ClusterFiles) -> None:
    if files.enrolled():
        info = files.read_json("cluster.json", {})
        raise ClusterStateError(
            f"this node is already node {info.get('node_id')} of cluster {info.get('cluster_id')} "
            f"(files in {files.dir}); remove that directory to start over"
        )


def init_cluster(files: ClusterFiles, name: str, now: float) -> Identity:
    """Create the CA and this node's certificate; this node becomes the CA holder."""
    refuse_if_member(files)
    when = pki.utc(now)
    cluster_id = secrets.token_hex(8)
    ca_key = pki.new_key()
    ca = pki.make_ca(ca_key, cluster_id, when)
    key = pki.new_key()
    cert, node_id = pki.issue_node_cert(
        ca, ca_key, pki.make_csr(key, name), name, when, x509.random_serial_number()
    )
    crl = pki.make_crl(ca, ca_key, {}, 1, when)
    files.write("ca.key", pki.key_to_pem(ca_key), PRIVATE)
    files.write_json(
        "members.json",
        {node_id: {"name": name, "serial": cert.serial_number, "issued": int(now)}},
        PUBLIC,
    )
    files.write_json("tokens.json", TokenBook().to_plain(), PRIVATE)
    _write_member_identity(files, pki.key_to_pem(key), cert, ca, crl.der, node_id)
    return files.load(when)


def _require_ca(files: ClusterFiles, what: str) -> tuple[x509.Certificate, object]:
    if not files.is_ca():
        raise NotCaHolder(
            f"this node does not hold the cluster CA key, so it cannot {what}; "
            "run the command on the node that ran `rackboot cluster init`"
        )
    ca = x509.load_pem_x509_certificate(files.read("ca.crt"))
    return ca, pki.key_from_pem(files.read("ca.key"))


def issue_token(files: ClusterFiles, addresses: list[str], ttl: float, now: float) -> Token:
    if not addresses:
        raise RackbootError(
            "no address to put in the token: set [cluster] advertise = 'host:port' "
            "(or listen on a specific address)"
        )
    ca, _ = _require_ca(files, "issue join tokens")
    book = TokenBook.from_plain(files.read_json("tokens.json", {}))
    token_id, secret = secrets.token_bytes(8), secrets.token_bytes(16)
    expires = book.issue(token_id, secret, now, ttl)
    files.write_json("tokens.json", book.to_plain(), PRIVATE)
    return Token(
        pki.ca_cluster_id(ca),
        bytes.fromhex(pki.fingerprint(ca)),
        token_id,
        secret,
        expires,
        tuple(addresses[:8]),
    )


@dataclass(frozen=True)
class Enrolled:
    node_id: str
    name: str
    cert_der: bytes
    crl_der: bytes


def enrol(files: ClusterFiles, request: dict, now: float) -> Enrolled:
    """Check a validated ``enrol`` message; consume its token; issue a certificate."""
    ca, ca_key = _require_ca(files, "enrol nodes")
    try:
        csr = pki.csr_from_der_untrusted(request["csr"])
    except pki.CertificateRefused as exc:
        raise EnrolRefused(str(exc)) from None
    public_key = csr.public_key()
    assert isinstance(public_key, Ed25519PublicKey)
    node_id = pki.public_id(public_key)
    members = files.read_json("members.json", {})
    if node_id in members:
        raise EnrolRefused(f"node {node_id} is already enrolled (or was removed); make a new key")
    book = TokenBook.from_plain(files.read_json("tokens.json", {}))
    try:
        book.redeem(request["token"], request["secret"], now, by=node_id)
    except TokenError as exc:
        raise EnrolRefused(str(exc)) from None
    files.write_json("tokens.json", book.to_plain(), PRIVATE)  # consumed before anything is issued
    name = request["name"][:63] or node_id
    cert, _ = pki.issue_node_cert(
        ca,
        ca_key,
        csr,
        name,
        pki.utc(now),
        x509.random_serial_number(),  # type: ignore[arg-type]
    )
    members[node_id] = {
        "name": name,
        "rack": request["rack"][:63],
        "serial": cert.serial_number,
        "issued": int(now),
    }
    files.write_json("members.json", members, PUBLIC)
    return Enrolled(node_id, name, pki.cert_der(cert), files.read("crl.der"))


def revoke(files: ClusterFiles, who: str, now: float) -> tuple[str, pki.Revocations]:
    """Revoke a member by node id, unique id prefix, or name; returns its id and the new list."""
    ca, ca_key = _require_ca(files, "remove nodes")
    members: dict[str, dict] = files.read_json("members.json", {})
    matches = [
        nid for nid, m in members.items() if who in (nid, m.get("name")) or nid.startswith(who)
    ] if who else []  # fmt: skip
    exact = [nid for nid in matches if who in (nid, members[nid].get("name"))]
    matches = exact or matches
    if len(matches) != 1:
        known = ", ".join(f"{m.get('name')} ({nid})" for nid, m in sorted(members.items()))
        raise RackbootError(
            f"{'no' if not matches else 'more than one'} member matches {who!r}; members: {known}"
        )
    node_id = matches[0]
    own = files.read_json("cluster.json", {}).get("node_id")
    if node_id == own:
        raise RackbootError("refusing to remove the CA holder itself")
    old = pki.crl_from_der_untrusted(files.read("crl.der"), ca)
    crl = x509.load_der_x509_crl(old.der)
    entries = {r.serial_number: r.revocation_date_utc for r in crl}
    entries[int(members[node_id]["serial"])] = pki.utc(now)
    new = pki.make_crl(ca, ca_key, entries, old.number + 1, pki.utc(now))  # type: ignore[arg-type]
    files.write("crl.der", new.der, PUBLIC)
    members[node_id]["revoked"] = int(now)
    files.write_json("members.json", members, PUBLIC)
    return node_id, new


def adopt_enrolment(
    files: ClusterFiles,
    key_pem: bytes,
    ca_der: bytes,
    cert_der: bytes,
    crl_der: bytes,
    now: float,
    seeds: tuple[str, ...] = (),
) -> Identity:
    """Store what a joining node received (already verified by the caller)."""
    refuse_if_member(files)
    ca = x509.load_der_x509_certificate(ca_der)
    cert = x509.load_der_x509_certificate(cert_der)
    who = pki.check_node_cert_untrusted(cert_der, ca, frozenset(), pki.utc(now))
    _write_member_identity(files, key_pem, cert, ca, crl_der, who.node_id, seeds)
    return files.load(pki.utc(now))
