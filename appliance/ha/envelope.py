"""Signed election datagrams (sans-IO).

The election travels over UDP rather than the cluster's TLS links (see
docs/ha.md, "Why UDP"): each datagram stands alone, so a lost one costs
one round, never a TCP retransmission timeout or a link's reconnection
backoff. Each datagram carries its sender's node certificate and an
Ed25519 signature with the node's key over a domain tag and the body:

    msgpack [1, certificate DER, payload, signature]    a message
    msgpack [2, certificate DER, CRL DER, signature]    a revocation list

A message's payload states the number of the sender's revocation list (the
``crl`` key of :mod:`appliance.ha.messages`, inside the signed bytes), so a
node with a newer list can send it: kind 2, signed over another domain tag
so neither kind's signature passes for the other. The list's trust comes
from the CA's signature on it, never from its sender: :class:`Opener` adopts
it only if the CA signed it and its number is higher than its own. This is
how a witness, which runs no cluster service, learns of a member removed with
``rackboot cluster remove`` (docs/ha.md, "Revocation").

Envelopes stay version 1 for messages: a sender older than the ``crl`` key
is accepted (it states no number and is sent no list), and an older receiver
ignores the key, so a rolling update keeps its election. An older receiver
drops a kind 2 datagram as malformed: one counted drop per list change.

:class:`Opener` checks the certificate against the cluster CA and the
revocation list once per certificate (cached; the cache is emptied when the
list changes), then the signature on every datagram, and only then decodes
the body. The node id it returns is the certificate's, never a claim of
the payload. Replays are the election's business (rising request ids per
sender): see docs/ha.md, "Replays".

Checking an unknown certificate costs a chain verification (~100 us): the
verdict is cached both ways (good certificates by digest, refusals for a
minute, each bounded), and the shell may refuse to spend it (``admit``: a
rate limit per source), so a flood of junk costs a hash per datagram at most.
A revocation list costs a verification once per distinct list (cached).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from appliance.cluster import pki
from appliance.ha.messages import BadMessage, Message, decode_stated_untrusted, encode

VERSION = 1  # kind 1: a message (the envelope's only kind before revocation lists)
CRL_KIND = 2
DOMAIN = b"rackboot-ha-1\x00"
CRL_DOMAIN = b"rackboot-ha-crl-1\x00"
MAX_DATAGRAM = 4096
MAX_CACHED = 64
MAX_REFUSED = 256
MAX_LISTS = 16  # revocation lists judged, by digest: a replayed one costs a hash
REFUSAL_TTL = dt.timedelta(minutes=1)
NO_REVOCATIONS = pki.Revocations(0, frozenset(), b"")


class Opened(NamedTuple):
    sender: str  # the node id its certificate proves
    message: Message | None  # None: the datagram carried a revocation list
    crl: int | None  # the sender's revocation list number (None: a sender that states none)
    adopted: pki.Revocations | None = None  # a newer list it brought, in force from now on
    # what it stated of its software (unchecked, None when absent: appliance/compat.py)
    version: Any = None
    protocols: Any = None


def seal(
    message: Message, key: Ed25519PrivateKey, cert_der: bytes, crl: int | None = None,
    speaks: tuple[str, list[int]] | None = None,
) -> bytes:  # fmt: skip
    """``crl``: this node's revocation list number; ``speaks``: its software version and
    election protocols; both stated in the signed payload."""
    payload = encode(message, crl=crl, speaks=speaks)
    return _pack(VERSION, cert_der, payload, key.sign(DOMAIN + payload))


def seal_crl(crl_der: bytes, key: Ed25519PrivateKey, cert_der: bytes) -> bytes:
    """A revocation list for a node whose datagrams stated an older one; the shell checks the
    result against :data:`MAX_DATAGRAM` (a list of about 80 removals or more does not fit)."""
    return _pack(CRL_KIND, cert_der, crl_der, key.sign(CRL_DOMAIN + crl_der))


def _pack(kind: int, cert_der: bytes, body: bytes, signature: bytes) -> bytes:
    return msgpack.packb([kind, cert_der, body, signature], use_bin_type=True)


class Opener:
    """Verifies datagrams from members of one cluster."""

    def __init__(self, ca, revocations: pki.Revocations = NO_REVOCATIONS) -> None:
        self.ca = ca
        self.revocations = revocations
        self._keys: dict[bytes, tuple[str, Ed25519PublicKey]] = {}
        # digest -> (why, until when), newest last
        self._refused: OrderedDict[bytes, tuple[str, dt.datetime]] = OrderedDict()
        self._lists: dict[bytes, pki.Revocations | str] = {}  # digest -> the list, or why not

    def adopt(self, crl: pki.Revocations) -> bool:
        """Use ``crl`` (verified against the CA by whoever made it) if its number is higher than
        ours: every certificate is judged again by it. Never goes back to an older list."""
        if crl.number <= self.revocations.number:
            return False
        self.revocations = crl
        self._keys.clear()
        self._refused.clear()
        return True

    def open_untrusted(
        self, datagram: bytes, now: dt.datetime, admit: Callable[[], bool] = lambda: True
    ) -> Opened:
        """What a datagram proves, or :class:`BadMessage` saying why not. ``admit`` is asked
        before a certificate seen neither good nor bad is verified."""
        kind, cert_der, body, signature = _outer_untrusted(datagram)
        node_id, public_key = self._sender(cert_der, now, admit)
        try:
            public_key.verify(signature, (DOMAIN if kind == VERSION else CRL_DOMAIN) + body)
        except (InvalidSignature, ValueError, TypeError):
            raise BadMessage(f"bad signature from node {node_id}", "signature") from None
        if kind == CRL_KIND:
            crl = self._judge_crl(node_id, body)
            return Opened(node_id, None, crl.number, crl if self.adopt(crl) else None)
        message, stated = decode_stated_untrusted(body)
        return Opened(node_id, message, stated.crl, None, stated.version, stated.protocols)

    def _judge_crl(self, node_id: str, der: bytes) -> pki.Revocations:
        digest = hashlib.sha256(der).digest()
        judged = self._lists.get(digest)
        if judged is None:
            judged = _crl_untrusted(der, self.ca)
            if len(self._lists) >= MAX_LISTS:
                self._lists.clear()
            self._lists[digest] = judged
        if isinstance(judged, str):
            raise BadMessage(
                f"revocation list from node {node_id} refused: {judged}", "revocation-list"
            )
        return judged

    def _sender(
        self, cert_der: bytes, now: dt.datetime, admit: Callable[[], bool]
    ) -> tuple[str, Ed25519PublicKey]:
        digest = hashlib.sha256(cert_der).digest()
        found = self._keys.get(digest)
        if found is not None:
            return found
        refused = self._refused.get(digest)
        if refused is not None and now < refused[1]:
            raise BadMessage(refused[0], "certificate")
        if not admit():
            raise BadMessage("unknown certificate not checked: rate limit", "rate-limited")
        try:
            who = pki.check_node_cert_untrusted(cert_der, self.ca, self.revocations.serials, now)
            public_key = pki.cert_from_der_untrusted(cert_der).public_key()
        except pki.CertificateRefused as exc:
            why = f"sender refused: {exc}"
            self._refused[digest] = (why, now + REFUSAL_TTL)  # a clock may be set right
            if len(self._refused) > MAX_REFUSED:
                self._refused.popitem(last=False)
            raise BadMessage(why, "certificate") from None
        assert isinstance(public_key, Ed25519PublicKey)  # the check refuses other keys
        if len(self._keys) >= MAX_CACHED:
            self._keys.clear()
        found = self._keys[digest] = (who.node_id, public_key)
        return found


def _outer_untrusted(datagram: bytes) -> tuple[int, bytes, bytes, bytes]:
    if len(datagram) > MAX_DATAGRAM:
        raise BadMessage(f"datagram of {len(datagram)} bytes exceeds {MAX_DATAGRAM}", "malformed")
    try:
        outer = msgpack.unpackb(
            datagram, raw=False, max_array_len=4, max_map_len=0, max_str_len=0,
            max_bin_len=MAX_DATAGRAM, ext_hook=_no_ext,
        )  # fmt: skip
    except Exception as exc:
        raise BadMessage(f"not a signed datagram ({type(exc).__name__})", "malformed") from None
    if not (
        isinstance(outer, list)
        and len(outer) == 4
        and type(outer[0]) is int
        and outer[0] in (VERSION, CRL_KIND)
        and all(isinstance(part, bytes) for part in outer[1:])
    ):
        raise BadMessage("not a signed datagram of kind 1 or 2", "malformed")
    return outer[0], outer[1], outer[2], outer[3]


def _crl_untrusted(der: bytes, ca) -> pki.Revocations | str:
    """The list if the CA signed it, else why not; total (cryptography parses lazily)."""
    try:
        return pki.crl_from_der_untrusted(der, ca)
    except pki.CertificateRefused as exc:
        return str(exc)
    except Exception as exc:  # a member's bytes, lazily parsed: any failure is a refusal
        return f"malformed revocation list ({type(exc).__name__})"


def _no_ext(code: int, data: bytes):
    raise BadMessage("extension types are not allowed", "malformed")
