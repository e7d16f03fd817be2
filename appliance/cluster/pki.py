"""Cluster certificates: the CA, node certificates, revocation lists (sans-IO).

Every key is Ed25519. A node's identity is the URI SAN
``rackboot://<cluster-id>/<node-id>`` of a certificate issued by the
cluster's CA; the node id is derived from the node's public key by the CA
(never taken from the request), so one key is one node id. Time is passed
in as ``now`` (an aware UTC datetime); nothing here touches files or sockets.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

URI_SCHEME = "rackboot"
ID_PATTERN = re.compile(r"[0-9a-f]{16}")
MAX_CERT_BYTES = 16 * 1024
MAX_CRL_BYTES = 1024 * 1024
CA_LIFETIME = dt.timedelta(days=365 * 30)
NODE_LIFETIME = dt.timedelta(days=365 * 10)
CRL_LIFETIME = dt.timedelta(days=365 * 30)  # members keep the newest; it never "expires" them open
CLOCK_SKEW = dt.timedelta(minutes=10)  # a certificate is valid this long before its notBefore


class CertificateRefused(Exception):
    """A certificate (or CSR, or CRL) that is not acceptable; the text says why."""


@dataclass(frozen=True)
class NodeIdentity:
    cluster_id: str
    node_id: str
    name: str
    serial: int


# -- keys -------------------------------------------------------------------


def new_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def key_to_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def key_from_pem(data: bytes) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(data, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise CertificateRefused(f"expected an Ed25519 private key, found {type(key).__name__}")
    return key


def public_id(public_key: Ed25519PublicKey) -> str:
    """16 hex digits naming a public key: the node id the CA assigns to it."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the certificate's DER, in hex: what a join token pins."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def node_uri(cluster_id: str, node_id: str) -> str:
    return f"{URI_SCHEME}://{cluster_id}/{node_id}"


def parse_node_uri(uri: str) -> tuple[str, str] | None:
    prefix = f"{URI_SCHEME}://"
    if not uri.startswith(prefix):
        return None
    cluster_id, _, node_id = uri[len(prefix) :].partition("/")
    if ID_PATTERN.fullmatch(cluster_id) and ID_PATTERN.fullmatch(node_id):
        return cluster_id, node_id
    return None


def _name(common_name: str, cluster_id: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"rackboot cluster {cluster_id}"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64] or "-"),
        ]
    )


# -- the CA -----------------------------------------------------------------


def make_ca(key: Ed25519PrivateKey, cluster_id: str, now: dt.datetime) -> x509.Certificate:
    if not ID_PATTERN.fullmatch(cluster_id):
        raise ValueError(f"cluster id must be 16 hex digits, got {cluster_id!r}")
    name = _name(f"rackboot CA {cluster_id}", cluster_id)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, None)
    )


def ca_cluster_id(ca: x509.Certificate) -> str:
    org = ca.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    value = str(org[0].value) if org else ""
    cluster_id = value.removeprefix("rackboot cluster ")
    if not ID_PATTERN.fullmatch(cluster_id):
        raise CertificateRefused("not a rackboot cluster CA (no cluster id in its subject)")
    return cluster_id


# -- node certificates ------------------------------------------------------


def make_csr(key: Ed25519PrivateKey, name: str) -> x509.CertificateSigningRequest:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64] or "-")])
    return x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, None)


def csr_from_der_untrusted(der: bytes) -> x509.CertificateSigningRequest:
    if len(der) > MAX_CERT_BYTES:
        raise CertificateRefused(f"request larger than {MAX_CERT_BYTES} bytes")
    try:
        csr = x509.load_der_x509_csr(der)
    except ValueError as exc:
        raise CertificateRefused(f"malformed certificate request: {exc}") from None
    if not isinstance(csr.public_key(), Ed25519PublicKey):
        raise CertificateRefused("certificate request is not for an Ed25519 key")
    if not csr.is_signature_valid:
        raise CertificateRefused("certificate request signature is invalid")
    return csr


def issue_node_cert(
    ca: x509.Certificate,
    ca_key: Ed25519PrivateKey,
    csr: x509.CertificateSigningRequest,
    name: str,
    now: dt.datetime,
    serial: int,
) -> tuple[x509.Certificate, str]:
    """Sign a node certificate for the CSR's key; returns it and the node id assigned."""
    public_key = csr.public_key()
    assert isinstance(public_key, Ed25519PublicKey)
    cluster_id = ca_cluster_id(ca)
    node_id = public_id(public_key)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name, cluster_id))
        .issuer_name(ca.subject)
        .public_key(public_key)
        .serial_number(serial)
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + NODE_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(node_uri(cluster_id, node_id))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, None)
    )
    return cert, node_id


def cert_from_der_untrusted(der: bytes) -> x509.Certificate:
    if len(der) > MAX_CERT_BYTES:
        raise CertificateRefused(f"certificate larger than {MAX_CERT_BYTES} bytes")
    try:
        return x509.load_der_x509_certificate(der)
    except Exception as exc:  # ValueError mostly; InvalidVersion and others too
        raise CertificateRefused(f"malformed certificate: {exc}") from None


def check_node_cert_untrusted(
    der: bytes,
    ca: x509.Certificate,
    revoked: frozenset[int],
    now: dt.datetime,
) -> NodeIdentity:
    """The identity a peer's certificate proves, or :class:`CertificateRefused` saying why not.

    TLS already checked the chain when the peer connected; this repeats the
    check on the exact bytes (a tampered certificate fails its signature),
    then applies what TLS does not know: the node URI of *our* cluster and
    the revocation list. cryptography parses a certificate's parts lazily and
    raises many types (ValueError, InvalidVersion, UnsupportedAlgorithm, ...)
    from attribute access: every one of them is a refusal here.
    """
    try:
        return _check_node_cert(der, ca, revoked, now)
    except CertificateRefused:
        raise
    except Exception as exc:  # lazily parsed bytes of a stranger: any failure is a refusal
        raise CertificateRefused(f"malformed certificate ({type(exc).__name__})") from None


def _check_node_cert(
    der: bytes, ca: x509.Certificate, revoked: frozenset[int], now: dt.datetime
) -> NodeIdentity:
    cert = cert_from_der_untrusted(der)
    cluster_id = ca_cluster_id(ca)
    if cert.issuer != ca.subject:
        raise CertificateRefused(f"certificate was not issued by the CA of cluster {cluster_id}")
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError) as exc:
        raise CertificateRefused(
            f"certificate signature does not verify against the CA of cluster {cluster_id}"
            f"{': ' + str(exc) if str(exc) else ''}"
        ) from None
    if not (cert.not_valid_before_utc - CLOCK_SKEW <= now <= cert.not_valid_after_utc):
        raise CertificateRefused(
            f"certificate is not valid now (valid {cert.not_valid_before_utc:%Y-%m-%d} "
            f"to {cert.not_valid_after_utc:%Y-%m-%d})"
        )
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CertificateRefused("certificate carries no node identity (no SAN)") from None
    ids = [parse_node_uri(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier)]
    ids = [i for i in ids if i is not None]
    if len(ids) != 1:
        raise CertificateRefused("certificate carries no single rackboot node URI")
    cert_cluster, node_id = ids[0]
    if cert_cluster != cluster_id:
        raise CertificateRefused(
            f"certificate is for cluster {cert_cluster}, we are cluster {cluster_id}"
        )
    key = cert.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise CertificateRefused(f"certificate key is {type(key).__name__}, not Ed25519")
    if node_id != public_id(key):
        raise CertificateRefused("certificate node id does not match its key")
    if cert.serial_number in revoked:
        raise CertificateRefused(
            f"node {node_id} is revoked (certificate serial {cert.serial_number:x})"
        )
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return NodeIdentity(cluster_id, node_id, str(cn[0].value) if cn else "", cert.serial_number)


# -- revocation -------------------------------------------------------------


@dataclass(frozen=True)
class Revocations:
    """A verified revocation list: its number (newer wins) and the revoked serials."""

    number: int
    serials: frozenset[int]
    der: bytes


def make_crl(
    ca: x509.Certificate,
    ca_key: Ed25519PrivateKey,
    serials: dict[int, dt.datetime],
    number: int,
    now: dt.datetime,
) -> Revocations:
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.subject)
        .last_update(now)
        .next_update(now + CRL_LIFETIME)
        .add_extension(x509.CRLNumber(number), critical=False)
    )
    for serial, when in sorted(serials.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build()
        )
    crl = builder.sign(ca_key, None)
    return Revocations(number, frozenset(serials), crl.public_bytes(serialization.Encoding.DER))


def crl_from_der_untrusted(der: bytes, ca: x509.Certificate) -> Revocations:
    """A revocation list signed by ``ca``, or :class:`CertificateRefused`."""
    if len(der) > MAX_CRL_BYTES:
        raise CertificateRefused(f"revocation list larger than {MAX_CRL_BYTES} bytes")
    try:
        crl = x509.load_der_x509_crl(der)
    except ValueError as exc:
        raise CertificateRefused(f"malformed revocation list: {exc}") from None
    if crl.issuer != ca.subject or not crl.is_signature_valid(ca.public_key()):  # type: ignore[arg-type]
        raise CertificateRefused("revocation list is not signed by our CA")
    try:
        number = crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except x509.ExtensionNotFound:
        raise CertificateRefused("revocation list has no CRL number") from None
    return Revocations(number, frozenset(r.serial_number for r in crl), der)


def cert_der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def csr_der(csr: x509.CertificateSigningRequest) -> bytes:
    return csr.public_bytes(serialization.Encoding.DER)


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def utc(timestamp: float) -> dt.datetime:
    """An aware UTC datetime from a POSIX timestamp (the shell's wall clock)."""
    return dt.datetime.fromtimestamp(timestamp, dt.UTC)
