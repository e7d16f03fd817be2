"""Signed election datagrams (sans-IO).

The election travels over UDP rather than the cluster's TLS links (see
docs/ha.md, "Why UDP"): each datagram stands alone, so a lost one costs
one round, never a TCP retransmission timeout or a link's reconnection
backoff. Each datagram carries its sender's node certificate and an
Ed25519 signature with the node's key over a domain tag and the payload:

    msgpack [1, certificate DER, payload, signature]

:class:`Opener` checks the certificate against the cluster CA and the
revocation list once per certificate (cached; the cache is emptied when the
list changes), then the signature on every datagram, and only then decodes
the payload. The node id it returns is the certificate's, never a claim of
the payload. Replays are the election's business (rising request ids per
sender): see docs/ha.md, "Replays".

Checking an unknown certificate costs a chain verification (~100 us): the
verdict is cached both ways (good certificates by digest, refusals for a
minute, each bounded), and the shell may refuse to spend it (``admit``: a
rate limit per source), so a flood of junk costs a hash per datagram at most.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import OrderedDict
from collections.abc import Callable

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from appliance.cluster import pki
from appliance.ha.messages import BadMessage, Message, decode_untrusted, encode

VERSION = 1
DOMAIN = b"rackboot-ha-1\x00"
MAX_DATAGRAM = 4096
MAX_CACHED = 64
MAX_REFUSED = 256
REFUSAL_TTL = dt.timedelta(minutes=1)


def seal(message: Message, key: Ed25519PrivateKey, cert_der: bytes) -> bytes:
    payload = encode(message)
    return msgpack.packb(
        [VERSION, cert_der, payload, key.sign(DOMAIN + payload)], use_bin_type=True
    )


class Opener:
    """Verifies datagrams from members of one cluster."""

    def __init__(self, ca, revoked: frozenset[int] = frozenset()) -> None:
        self.ca = ca
        self.revoked = revoked
        self._keys: dict[bytes, tuple[str, Ed25519PublicKey]] = {}
        # digest -> (why, until when), newest last
        self._refused: OrderedDict[bytes, tuple[str, dt.datetime]] = OrderedDict()

    def set_revoked(self, revoked: frozenset[int]) -> None:
        if revoked is not self.revoked and revoked != self.revoked:
            self.revoked = revoked
            self._keys.clear()
            self._refused.clear()

    def open_untrusted(
        self, datagram: bytes, now: dt.datetime, admit: Callable[[], bool] = lambda: True
    ) -> tuple[str, Message]:
        """(sender node id, message), or :class:`BadMessage` saying why not. ``admit`` is
        asked before a certificate seen neither good nor bad is verified."""
        if len(datagram) > MAX_DATAGRAM:
            raise BadMessage(
                f"datagram of {len(datagram)} bytes exceeds {MAX_DATAGRAM}", "malformed"
            )
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
            and outer[0] == VERSION
            and all(isinstance(part, bytes) for part in outer[1:])
        ):
            raise BadMessage("not a signed datagram of version 1", "malformed")
        _, cert_der, payload, signature = outer
        node_id, public_key = self._sender(cert_der, now, admit)
        try:
            public_key.verify(signature, DOMAIN + payload)
        except (InvalidSignature, ValueError, TypeError):
            raise BadMessage(f"bad signature from node {node_id}", "signature") from None
        return node_id, decode_untrusted(payload)

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
            who = pki.check_node_cert_untrusted(cert_der, self.ca, self.revoked, now)
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


def _no_ext(code: int, data: bytes):
    raise BadMessage("extension types are not allowed", "malformed")
