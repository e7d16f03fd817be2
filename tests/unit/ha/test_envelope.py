"""Signed election datagrams: the sender is who its certificate proves, nothing else passes;
a revocation list is adopted only if the CA signed it and it is newer."""

from __future__ import annotations

import datetime as dt

import msgpack
import pytest
from cryptography import x509
from hypothesis import given
from hypothesis import strategies as st

from appliance.cluster import pki
from appliance.ha import envelope
from appliance.ha.envelope import MAX_DATAGRAM, Opened, Opener, seal, seal_crl
from appliance.ha.messages import BadMessage, Prepare, encode

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

    def crl(serials=(), number=2, key=ca_key):
        return pki.make_crl(ca, key, dict.fromkeys(serials, NOW), number, NOW)

    member.crl = crl  # type: ignore[attr-defined]
    member.fixed = member("delta", 11)  # type: ignore[attr-defined]
    return ca, member


def test_a_member_datagram_opens_to_its_node_id_and_message(cluster):
    ca, member = cluster
    der, key, node_id = member()
    datagram = seal(MESSAGE, key, der)
    assert len(datagram) < 700
    opener = Opener(ca)
    assert opener.open_untrusted(datagram, NOW) == Opened(node_id, MESSAGE, None)
    assert opener.open_untrusted(datagram, NOW)[:4] == (node_id, MESSAGE, None, None)  # cached


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
    opener = Opener(ca, member.crl(number=1))
    opener.open_untrusted(seal(MESSAGE, key, der), NOW)
    assert opener.adopt(member.crl({99}, number=2))  # the cache goes with the old list
    with pytest.raises(BadMessage, match="revoked"):
        opener.open_untrusted(seal(MESSAGE, key, der), NOW)
    assert not opener.adopt(member.crl(number=1))  # never back to an older list
    assert opener.revocations.number == 2


@pytest.mark.parametrize(
    "datagram, reason",
    [
        (b"\x00" * 5000, "exceeds 4096"),
        (b"\xc1", "not a signed datagram"),
        (msgpack.packb([3, b"", b"", b""]), "kind 1 or 2"),
        (msgpack.packb([True, b"", b"", b""]), "kind 1 or 2"),
        (msgpack.packb([1, "x", b"", b""]), "not a signed datagram"),
        (msgpack.packb([2, b"", b"", b"", b""]), "not a signed datagram"),
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


# -- the revocation list number stated in every message ------------------------------


def test_the_senders_list_number_is_stated_inside_the_signed_payload(cluster):
    ca, member = cluster
    der, key, node_id = member()
    datagram = seal(MESSAGE, key, der, crl=5)
    assert Opener(ca).open_untrusted(datagram, NOW)[:4] == (node_id, MESSAGE, 5, None)
    kind, cert, payload, signature = msgpack.unpackb(datagram)
    raised = encode(MESSAGE, crl=6)  # a number changed on the way
    with pytest.raises(BadMessage, match="bad signature") as refused:
        Opener(ca).open_untrusted(msgpack.packb([kind, cert, raised, signature]), NOW)
    assert refused.value.kind == "signature"


def test_a_sender_older_than_the_number_is_accepted_and_states_none(cluster):
    """A rolling update: the old envelope (version 1, no ``crl`` key) still votes."""
    ca, member = cluster
    der, key, node_id = member()
    payload = msgpack.packb({"t": "prepare", **MESSAGE.__dict__})
    old = msgpack.packb([1, der, payload, key.sign(envelope.DOMAIN + payload)])
    assert Opener(ca).open_untrusted(old, NOW)[:4] == (node_id, MESSAGE, None, None)


@pytest.mark.parametrize("value", [-1, 2**63, True, "2", 1.5, [2]])
def test_a_stated_number_of_the_wrong_type_or_range_is_a_bad_message(cluster, value):
    ca, member = cluster
    der, key, _ = member()
    payload = msgpack.packb({"t": "prepare", **MESSAGE.__dict__, "crl": value})
    datagram = msgpack.packb([1, der, payload, key.sign(envelope.DOMAIN + payload)])
    with pytest.raises(BadMessage, match="'crl'") as refused:
        Opener(ca).open_untrusted(datagram, NOW)
    assert refused.value.kind == "message"


# -- revocation lists as datagrams ----------------------------------------------------


def test_a_newer_list_signed_by_the_ca_is_adopted_and_refuses_the_revoked_from_then_on(cluster):
    ca, member = cluster
    der, key, node_id = member()
    gamma_der, gamma_key, _ = member("gamma", 99)
    opener = Opener(ca, member.crl(number=1))
    opener.open_untrusted(seal(MESSAGE, gamma_key, gamma_der), NOW)  # gamma known and cached
    newer = member.crl({99}, number=2)
    assert opener.open_untrusted(seal_crl(newer.der, key, der), NOW)[:4] == (
        node_id, None, 2, newer,
    )  # fmt: skip
    assert opener.revocations == newer
    with pytest.raises(BadMessage, match="node .* is revoked"):
        opener.open_untrusted(seal(MESSAGE, gamma_key, gamma_der), NOW)
    # the same list again (a duplicate or a replay) is received, not adopted again
    assert opener.open_untrusted(seal_crl(newer.der, key, der), NOW).adopted is None


@pytest.mark.parametrize("number", [1, 2])
def test_an_older_or_equal_list_is_not_adopted(cluster, number):
    ca, member = cluster
    der, key, node_id = member()
    ours = member.crl({5}, number=2)
    opener = Opener(ca, ours)
    other = member.crl({99}, number=number)
    assert opener.open_untrusted(seal_crl(other.der, key, der), NOW)[:4] == (
        node_id, None, number, None,
    )  # fmt: skip
    assert opener.revocations is ours


def test_a_list_not_signed_by_the_ca_is_refused_and_not_adopted(cluster):
    """A forged list: same subject as the cluster's CA (a CA made with the same cluster id),
    another key; or a list a member signed with its own key."""
    ca, member = cluster
    der, key, node_id = member()
    impostor_key = pki.new_key()
    impostor = pki.make_ca(impostor_key, "0123456789abcdef", NOW)
    assert impostor.subject == ca.subject
    forged = pki.make_crl(impostor, impostor_key, {7: NOW}, 9, NOW)
    own = member.crl({7}, number=9, key=key)
    opener = Opener(ca, member.crl(number=1))
    for crl in (forged, own):
        with pytest.raises(BadMessage, match=f"node {node_id} refused: .*not signed") as refused:
            opener.open_untrusted(seal_crl(crl.der, key, der), NOW)
        assert refused.value.kind == "revocation-list"
    assert opener.revocations.number == 1


def test_a_list_too_large_for_one_datagram_is_refused_as_malformed(cluster):
    ca, member = cluster
    der, key, _ = member()
    serials = [x509.random_serial_number() for _ in range(100)]  # as the CA gives them
    large = member.crl(serials, number=3)  # 100 removals: ~4 KB of DER
    datagram = seal_crl(large.der, key, der)
    assert len(datagram) > MAX_DATAGRAM
    with pytest.raises(BadMessage, match="exceeds 4096") as refused:
        Opener(ca).open_untrusted(datagram, NOW)
    assert refused.value.kind == "malformed"


def test_a_message_signature_never_passes_for_a_list_nor_the_reverse(cluster):
    ca, member = cluster
    der, key, _ = member()
    crl = member.crl(number=2)
    _, cert, payload, signature = msgpack.unpackb(seal(MESSAGE, key, der))
    _, _, crl_der, crl_signature = msgpack.unpackb(seal_crl(crl.der, key, der))
    for kind, body, sig in ((2, payload, signature), (1, crl_der, crl_signature)):
        with pytest.raises(BadMessage, match="bad signature"):
            Opener(ca).open_untrusted(msgpack.packb([kind, cert, body, sig]), NOW)


def test_a_replayed_list_is_verified_once(cluster, monkeypatch):
    ca, member = cluster
    der, key, _ = member()
    verified = []
    real = pki.crl_from_der_untrusted
    monkeypatch.setattr(
        pki, "crl_from_der_untrusted", lambda d, c: verified.append(1) or real(d, c)
    )
    opener = Opener(ca, member.crl(number=3))
    for crl in (member.crl(number=2), pki.Revocations(0, frozenset(), b"junk")):
        datagram = seal_crl(crl.der, key, der)
        for _ in range(5):
            try:
                opener.open_untrusted(datagram, NOW)
            except BadMessage:
                pass
    assert len(verified) == 2


@given(st.binary(max_size=3000))
def test_arbitrary_list_bytes_from_a_member_raise_only_bad_message(cluster, data):
    ca, member = cluster
    der, key, _ = member.fixed
    try:
        opened = Opener(ca).open_untrusted(seal_crl(data, key, der), NOW)
    except BadMessage as exc:
        assert exc.kind in ("revocation-list", "malformed")
    else:  # only the CA's lists pass
        assert pki.crl_from_der_untrusted(data, ca).number == opened.crl
