"""Certificates and revocation lists: what a peer's certificate proves, and what it does not."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509

from appliance.cluster import pki

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def ca():
    key = pki.new_key()
    return pki.make_ca(key, "0123456789abcdef", NOW), key


def issue(ca, name="beta", serial=42):
    cert, key = ca
    node_key = pki.new_key()
    node_cert, node_id = pki.issue_node_cert(
        cert, key, pki.make_csr(node_key, name), name, NOW, serial
    )
    return node_cert, node_id, node_key


def test_a_member_certificate_proves_its_node_id(ca):
    cert, node_id, key = issue(ca)
    who = pki.check_node_cert_untrusted(pki.cert_der(cert), ca[0], frozenset(), NOW)
    assert who == pki.NodeIdentity("0123456789abcdef", node_id, "beta", 42)
    assert node_id == pki.public_id(key.public_key())  # derived from the key, not requested
    uri = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert uri.get_values_for_type(x509.UniformResourceIdentifier) == [
        f"rackboot://0123456789abcdef/{node_id}"
    ]


def test_another_clusters_certificate_is_refused(ca):
    other = (pki.make_ca(k := pki.new_key(), "fedcba9876543210", NOW), k)
    cert, _, _ = issue(other)
    with pytest.raises(pki.CertificateRefused, match="not issued by the CA of cluster 0123"):
        pki.check_node_cert_untrusted(pki.cert_der(cert), ca[0], frozenset(), NOW)


def test_a_tampered_certificate_is_refused(ca):
    cert, node_id, _ = issue(ca)
    der = bytearray(pki.cert_der(cert))
    at = der.find(node_id.encode())
    der[at] = ord("0") if der[at] != ord("0") else ord("1")  # claim another node id
    with pytest.raises(pki.CertificateRefused, match="signature does not verify"):
        pki.check_node_cert_untrusted(bytes(der), ca[0], frozenset(), NOW)


def test_a_self_made_certificate_with_our_ca_name_is_refused(ca):
    impostor_key = pki.new_key()
    fake_ca = pki.make_ca(impostor_key, "0123456789abcdef", NOW)  # same subject, other key
    cert, _, _ = issue((fake_ca, impostor_key))
    with pytest.raises(pki.CertificateRefused, match="signature does not verify"):
        pki.check_node_cert_untrusted(pki.cert_der(cert), ca[0], frozenset(), NOW)


def test_revoked_and_expired_certificates_are_refused(ca):
    cert, node_id, _ = issue(ca, serial=77)
    crl = pki.make_crl(ca[0], ca[1], {77: NOW}, 2, NOW)
    revoked = pki.crl_from_der_untrusted(crl.der, ca[0])
    assert revoked.number == 2 and revoked.serials == {77}
    with pytest.raises(pki.CertificateRefused, match=f"node {node_id} is revoked"):
        pki.check_node_cert_untrusted(pki.cert_der(cert), ca[0], revoked.serials, NOW)
    with pytest.raises(pki.CertificateRefused, match="not valid now"):
        pki.check_node_cert_untrusted(
            pki.cert_der(cert), ca[0], frozenset(), NOW + dt.timedelta(days=365 * 11)
        )


def test_a_revocation_list_must_be_signed_by_our_ca(ca):
    other_key = pki.new_key()
    forged = pki.make_crl(ca[0], other_key, {}, 99, NOW)  # our CA's name, someone else's key
    with pytest.raises(pki.CertificateRefused, match="not signed by our CA"):
        pki.crl_from_der_untrusted(forged.der, ca[0])
    with pytest.raises(pki.CertificateRefused, match="malformed"):
        pki.crl_from_der_untrusted(b"\x30\x03abc", ca[0])


def test_garbage_and_oversized_inputs_are_refused(ca):
    for bad in (b"", b"\x30\x82junk", b"x" * (pki.MAX_CERT_BYTES + 1)):
        with pytest.raises(pki.CertificateRefused):
            pki.check_node_cert_untrusted(bad, ca[0], frozenset(), NOW)
        with pytest.raises(pki.CertificateRefused):
            pki.csr_from_der_untrusted(bad)


def test_node_uris():
    assert pki.parse_node_uri("rackboot://0123456789abcdef/fedcba9876543210") == (
        "0123456789abcdef",
        "fedcba9876543210",
    )
    for bad in ("https://x/y", "rackboot://short/fedcba9876543210", "rackboot://0123456789abcdef"):
        assert pki.parse_node_uri(bad) is None
