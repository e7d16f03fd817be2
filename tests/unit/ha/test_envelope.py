"""Signed election datagrams: the sender is who its certificate proves, nothing else passes."""

from __future__ import annotations

import datetime as dt

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.cluster import pki
from appliance.ha.envelope import Opener, seal
from appliance.ha.messages import BadMessage, Prepare

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
MESSAGE = Prepare("rack1", 1, 1, "d" * 32, ["a" * 16])


@pytest.fixture(scope="module")
def cluster():
    ca_key = pki.new_key()
    ca = pki.make_ca(ca_key, "0123456789abcdef", NOW)

    def member(name="alpha", serial=7, issuer=(ca, ca_key)):
        key = pki.new_key()
        cert, node_id = pki.issue_node_cert(
            issuer[0], issuer[1], pki.make_csr(key, name), name, NOW, serial
        )
        return pki.cert_der(cert), key, node_id

    return ca, member


def test_a_member_datagram_opens_to_its_node_id_and_message(cluster):
    ca, member = cluster
    der, key, node_id = member()
    datagram = seal(MESSAGE, key, der)
    assert len(datagram) < 700
    opener = Opener(ca)
    assert opener.open_untrusted(datagram, NOW) == (node_id, MESSAGE)
    assert opener.open_untrusted(datagram, NOW) == (node_id, MESSAGE)  # from the cache


def test_a_signature_by_another_key_is_refused(cluster):
    ca, member = cluster
    der, _, node_id = member()
    _, other_key, _ = member("beta", 8)
    with pytest.raises(BadMessage, match=f"bad signature from node {node_id}"):
        Opener(ca).open_untrusted(seal(MESSAGE, other_key, der), NOW)


def test_a_changed_payload_is_refused(cluster):
    ca, member = cluster
    der, key, _ = member()
    version, cert, payload, signature = msgpack.unpackb(seal(MESSAGE, key, der))
    forged = msgpack.packb([version, cert, payload.replace(b"rack1", b"rack2"), signature])
    with pytest.raises(BadMessage, match="bad signature"):
        Opener(ca).open_untrusted(forged, NOW)


def test_another_clusters_member_and_a_revoked_member_are_refused(cluster):
    ca, member = cluster
    other_key = pki.new_key()
    other_ca = pki.make_ca(other_key, "fedcba9876543210", NOW)
    der, key, _ = member(issuer=(other_ca, other_key))
    with pytest.raises(BadMessage, match="sender refused: .*not issued by the CA"):
        Opener(ca).open_untrusted(seal(MESSAGE, key, der), NOW)
    der, key, _ = member("gamma", 99)
    opener = Opener(ca)
    opener.open_untrusted(seal(MESSAGE, key, der), NOW)
    opener.set_revoked(frozenset({99}))  # the cache goes with the old list
    with pytest.raises(BadMessage, match="revoked"):
        opener.open_untrusted(seal(MESSAGE, key, der), NOW)


@pytest.mark.parametrize(
    "datagram, reason",
    [
        (b"\x00" * 5000, "exceeds 4096"),
        (b"\xc1", "not a signed datagram"),
        (msgpack.packb([2, b"", b"", b""]), "version 1"),
        (msgpack.packb([1, "x", b"", b""]), "not a signed datagram"),
    ],
)
def test_garbage_is_refused(cluster, datagram, reason):
    with pytest.raises(BadMessage, match=reason):
        Opener(cluster[0]).open_untrusted(datagram, NOW)


@given(st.binary(max_size=600))
def test_arbitrary_bytes_raise_only_bad_message(data):
    try:
        Opener(None).open_untrusted(data, NOW)
    except BadMessage:
        pass
