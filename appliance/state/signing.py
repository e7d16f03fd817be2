"""Signed replication frames (sans-IO).

Every message of the replication stream, either way, is one frame:

    msgpack [1, signer node id, payload, Ed25519 signature over DOMAIN + payload]

signed with the sender's cluster key. The receiver checks, in this order and
before unpacking anything of the payload: the size, the outer shape, that the
signer is a node it expects on this stream (the peer the TLS link
authenticated, and one of the rack's appliances), and the signature over the
exact payload bytes. Only then is the payload decoded (capped, string keys,
no extension types). Frames are signed, not records: one signature (~32 µs)
covers a batch.

Freshness and order are the protocol's (appliance/state/replication.py): a
frame of an epoch lower than the highest seen is refused (the fencing token
at work), and records must continue the log exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from appliance.state.records import BadEntry, unpack_untrusted

VERSION = 1
DOMAIN = b"rackboot-state-1\x00"
MAX_FRAME = 4 * 1024 * 1024  # a batch of records or a snapshot chunk, with room to spare


class Refused(ValueError):
    """A frame that is not accepted; ``reason`` is its counter's name."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def seal(payload: Any, key: Ed25519PrivateKey, signer: str) -> bytes:
    body = msgpack.packb(payload, use_bin_type=True)
    return msgpack.packb([VERSION, signer, body, key.sign(DOMAIN + body)], use_bin_type=True)


def open_untrusted(
    data: bytes, key_of: Callable[[str], Ed25519PublicKey | None]
) -> tuple[str, Any]:
    """The signer and the decoded payload of a frame; :class:`Refused` otherwise.
    ``key_of(node_id)`` is the public key of a signer allowed here, or None."""
    if len(data) > MAX_FRAME:
        raise Refused("malformed", f"frame of {len(data)} bytes")
    try:
        outer = unpack_untrusted(data, MAX_FRAME)
    except BadEntry as exc:
        raise Refused("malformed", str(exc)) from None
    if not (
        isinstance(outer, list)
        and len(outer) == 4
        and outer[0] == VERSION
        and isinstance(outer[1], str)
        and isinstance(outer[2], bytes)
        and isinstance(outer[3], bytes)
    ):
        raise Refused("malformed", "not a signed frame")
    _, signer, body, signature = outer
    public = key_of(signer)
    if public is None:
        raise Refused("unknown-key", f"signer {signer[:20]!r}")
    try:
        public.verify(signature, DOMAIN + body)
    except InvalidSignature:
        raise Refused("signature") from None
    try:
        return signer, unpack_untrusted(body, MAX_FRAME)
    except BadEntry as exc:
        raise Refused("malformed", str(exc)) from None
