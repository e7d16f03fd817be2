"""Join tokens (sans-IO): what ``rackboot cluster token`` prints and ``join`` pastes.

A token is one copy-pasteable string::

    rbj1.<base64url( msgpack [1, cluster_id, ca_sha256, token_id, secret, expires, [addr...]] + crc32 )>

* ``cluster_id`` (16 hex digits) and ``ca_sha256`` (32 bytes): the joining node
  pins the CA by this fingerprint, so it trusts only the cluster it was told to join.
* ``token_id`` (8 bytes) and ``secret`` (16 random bytes): the enrolling member
  keeps only SHA-256(secret), and honours a token once, before ``expires``
  (POSIX seconds).
* ``addr``: ``host:port`` of the member(s) that can enrol (the CA holder).
* the CRC-32 catches a token mangled by copy and paste before any network I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgpack

PREFIX = "rbj1."
TOKEN_FORMAT = 1
MAX_TOKEN_CHARS = 2048
MAX_ADDRESSES = 8
ADDRESS = re.compile(r"[A-Za-z0-9.:\-\[\]]{1,255}:[0-9]{1,5}")
DEFAULT_TTL = 3600.0


class TokenError(Exception):
    """A token that cannot be decoded or is not acceptable; the text says why."""


@dataclass(frozen=True)
class Token:
    cluster_id: str
    ca_sha256: bytes
    token_id: bytes
    secret: bytes
    expires: int
    addresses: tuple[str, ...]

    @property
    def ca_fingerprint(self) -> str:
        return self.ca_sha256.hex()

    def encode(self) -> str:
        body = msgpack.packb(
            [
                TOKEN_FORMAT,
                self.cluster_id,
                self.ca_sha256,
                self.token_id,
                self.secret,
                self.expires,
                list(self.addresses),
            ],
            use_bin_type=True,
        )
        body += zlib.crc32(body).to_bytes(4, "big")
        return PREFIX + base64.urlsafe_b64encode(body).decode().rstrip("=")


def decode_untrusted(text: str, now: float) -> Token:
    """Decode a pasted token; refuses a malformed, corrupted or expired one."""
    text = "".join(text.split())  # a token wrapped by a terminal still pastes
    if len(text) > MAX_TOKEN_CHARS:
        raise TokenError(f"token longer than {MAX_TOKEN_CHARS} characters")
    if not text.startswith(PREFIX):
        raise TokenError(f"not a rackboot join token (it should start with {PREFIX!r})")
    encoded = text[len(PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (ValueError, TypeError):
        raise TokenError("token is not valid base64url (was it copied whole?)") from None
    if len(raw) < 5 or zlib.crc32(raw[:-4]).to_bytes(4, "big") != raw[-4:]:
        raise TokenError("token checksum does not match (was it copied whole?)")
    try:
        fields = msgpack.unpackb(
            raw[:-4], raw=False, strict_map_key=True, max_bin_len=64, max_str_len=512,
            max_array_len=16, max_map_len=0, max_ext_len=0,
        )  # fmt: skip
    except Exception as exc:  # msgpack raises several types for garbage
        raise TokenError(f"token body is malformed ({type(exc).__name__})") from None
    if not isinstance(fields, list) or not fields or fields[0] != TOKEN_FORMAT:
        raise TokenError("token format is not supported by this version")
    if len(fields) != 7:
        raise TokenError("token body is malformed (wrong field count)")
    _, cluster_id, ca_sha256, token_id, secret, expires, addresses = fields
    if not (isinstance(cluster_id, str) and re.fullmatch(r"[0-9a-f]{16}", cluster_id)):
        raise TokenError("token carries no valid cluster id")
    if not (isinstance(ca_sha256, bytes) and len(ca_sha256) == 32):
        raise TokenError("token carries no valid CA fingerprint")
    if not (isinstance(token_id, bytes) and len(token_id) == 8):
        raise TokenError("token carries no valid token id")
    if not (isinstance(secret, bytes) and len(secret) == 16):
        raise TokenError("token carries no valid secret")
    if isinstance(expires, bool) or not isinstance(expires, int):
        raise TokenError("token carries no valid expiry")
    if (
        not isinstance(addresses, list)
        or not 0 < len(addresses) <= MAX_ADDRESSES
        or not all(isinstance(a, str) and ADDRESS.fullmatch(a) for a in addresses)
    ):
        raise TokenError("token carries no valid member address")
    token = Token(cluster_id, ca_sha256, token_id, secret, expires, tuple(addresses))
    if now >= expires:
        raise TokenError(f"token expired {int(now - expires)} s ago; ask for a new one")
    return token


def secret_hash(secret: bytes) -> str:
    return hashlib.sha256(b"rackboot join token\0" + secret).hexdigest()


@dataclass
class TokenBook:
    """The enrolling member's outstanding tokens: hashed secrets, each honoured once.

    Plain data in, plain data out (:meth:`to_plain`/:meth:`from_plain`); the
    shell persists it atomically after every change.
    """

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    def issue(self, token_id: bytes, secret: bytes, now: float, ttl: float) -> int:
        self.prune(now)
        expires = int(now + ttl)
        self.entries[token_id.hex()] = {"hash": secret_hash(secret), "expires": expires}
        return expires

    def redeem(self, token_id: bytes, secret: bytes, now: float, by: str) -> None:
        """Consume a token, or raise :class:`TokenError` (unknown, used, expired, wrong secret)."""
        entry = self.entries.get(token_id.hex()) if isinstance(token_id, bytes) else None
        if entry is None:
            raise TokenError("unknown join token (made by another member, or pruned)")
        if not hmac.compare_digest(entry["hash"], secret_hash(secret)):
            raise TokenError("join token secret does not match")
        if entry.get("used_by"):
            raise TokenError(f"join token already used (by node {entry['used_by']})")
        if now >= entry["expires"]:
            raise TokenError("join token expired")
        entry["used_by"] = by
        entry["used_at"] = int(now)

    def prune(self, now: float, keep_used: float = 7 * 86400) -> None:
        """Drop expired unused tokens and old used ones."""
        self.entries = {
            k: e
            for k, e in self.entries.items()
            if (e.get("used_by") and now - e.get("used_at", 0) < keep_used)
            or (not e.get("used_by") and now < e["expires"])
        }

    def outstanding(self, now: float) -> int:
        return sum(1 for e in self.entries.values() if not e.get("used_by") and now < e["expires"])

    def to_plain(self) -> dict[str, Any]:
        return {"tokens": self.entries}

    @classmethod
    def from_plain(cls, data: Any) -> TokenBook:
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, dict):
            return cls()
        good = {
            k: dict(v)
            for k, v in tokens.items()
            if isinstance(v, dict)
            and isinstance(v.get("hash"), str)
            and isinstance(v.get("expires"), int)
        }
        return cls(good)
