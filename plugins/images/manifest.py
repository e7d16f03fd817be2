"""Image manifests: the chunk table, the signed head, and table deltas (sans-IO).

An image version is described by two objects:

* its **chunk table**: the chunker's parameters and, in file order, each
  chunk's SHA-256 and size. It is content-addressed: its own SHA-256 (over
  the exact encoded bytes) names it, so a node may take it from anyone and
  check it. For a 1 GiB image it is ~0.5 MB, too large for a record of the
  state log (64 KiB), and mostly equal to the previous version's: peers send
  it as a **delta** against a table the receiver has (:func:`diff`,
  :func:`apply_untrusted`).
* its **head**: name, version, size, whole-file SHA-256, chunker parameters,
  the table's digest and chunk count, when and by whom it was made, signed
  with the signer's cluster key (Ed25519) and carrying the signer's
  certificate. The head is what the rack's state log replicates (~1 KB).

Whoever checks a head decides which signers it trusts (``trust``): the
cluster's CA, or this node's own key for a node without a cluster identity.
Every decoder here is ``*_untrusted``: sizes capped before anything is
unpacked, shapes and ranges checked, :class:`BadManifest` otherwise.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from appliance.state.records import BadEntry, unpack_untrusted

FORMAT = 1
DOMAIN = b"rackboot-image-head-1\x00"  # what a head's signature covers, before its body
DIGEST = 32  # bytes of a SHA-256
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,31}")
MAX_HEAD = 16 * 1024  # a head with its certificate
MAX_CHUNKS = 1 << 21  # 2 Mi chunks: 128 TiB at the default average, 32 GiB at 16 KiB
MAX_TABLE = 64 + MAX_CHUNKS * (DIGEST + 4)
MAX_SIZE = 1 << 46
_SIZE = struct.Struct("<I")


class BadManifest(ValueError):
    """A table, head or delta that is refused; the text says why."""


@dataclass(frozen=True)
class Params:
    """The chunker's parameters (pyfastcdc's FastCDC): recorded in every table, since
    another node must cut the same file the same way to find the same chunks."""

    min_size: int = 16 * 1024
    avg_size: int = 64 * 1024
    max_size: int = 256 * 1024

    def problem(self) -> str | None:
        """Why pyfastcdc would refuse these, or None."""
        if not 64 <= self.min_size <= 1 << 20:
            return "min_size within 64 B .. 1 MiB"
        if not 256 <= self.avg_size <= 4 << 20:
            return "avg_size within 256 B .. 4 MiB"
        if not 1024 <= self.max_size <= 16 << 20:
            return "max_size within 1 KiB .. 16 MiB"
        if not self.min_size <= self.avg_size <= self.max_size:
            return "min_size <= avg_size <= max_size"
        return None

    def as_list(self) -> list[int]:
        return [self.min_size, self.avg_size, self.max_size]


@dataclass(frozen=True)
class Table:
    """The chunks of one image version, in file order."""

    params: Params
    ids: tuple[bytes, ...]
    sizes: tuple[int, ...]

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def encode(self) -> bytes:
        return msgpack.packb(
            [FORMAT, self.params.as_list(), b"".join(self.ids),
             b"".join(_SIZE.pack(n) for n in self.sizes)],
            use_bin_type=True,
        )  # fmt: skip

    def digest(self) -> bytes:
        return hashlib.sha256(self.encode()).digest()

    def offsets(self) -> list[int]:
        """Where each chunk starts in the file."""
        out, at = [], 0
        for n in self.sizes:
            out.append(at)
            at += n
        return out


def decode_table_untrusted(data: bytes, want: bytes) -> Table:
    """The chunk table ``data`` encodes, if its SHA-256 is ``want`` (the head's)."""
    if len(data) > MAX_TABLE or hashlib.sha256(data).digest() != want:
        raise BadManifest("the chunk table does not match its digest")
    fields = _unpack(data, MAX_TABLE)
    if not (isinstance(fields, list) and len(fields) == 4 and fields[0] == FORMAT):
        raise BadManifest("not a chunk table of a known format")
    _, raw_params, ids, sizes = fields
    params = _params_untrusted(raw_params)
    if not (isinstance(ids, bytes) and isinstance(sizes, bytes)):
        raise BadManifest("chunk ids and sizes must be bytes")
    count = len(ids) // DIGEST
    if len(ids) % DIGEST or len(sizes) != 4 * count or count > MAX_CHUNKS:
        raise BadManifest("chunk ids and sizes do not describe the same chunks")
    size_list = [n for (n,) in _SIZE.iter_unpack(sizes)]
    for i, n in enumerate(size_list):
        # Every chunk lies within the cut limits; only the last may be short.
        if n > params.max_size or n == 0 or (n < params.min_size and i != count - 1):
            raise BadManifest(f"chunk {i} has {n} bytes, outside the table's parameters")
    return Table(params, tuple(ids[i : i + DIGEST] for i in range(0, len(ids), DIGEST)),
                 tuple(size_list))  # fmt: skip


@dataclass(frozen=True)
class Head:
    """The signed description of an image version."""

    name: str
    version: str
    size: int
    sha256: bytes  # of the whole file
    params: Params
    table: bytes  # the chunk table's digest
    chunks: int
    created: float  # unix time the version was added
    signer: str  # node id (cluster key) or "local:<16 hex>" (a node without an identity)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def encode(self) -> bytes:
        return msgpack.packb(
            [FORMAT, self.name, self.version, self.size, self.sha256, self.params.as_list(),
             self.table, self.chunks, self.created, self.signer],
            use_bin_type=True,
        )  # fmt: skip


def check_name(kind: str, value: str) -> str | None:
    """Why ``value`` is no image name (``kind`` 'name') or version ('version'), or None."""
    pattern = NAME_RE if kind == "name" else VERSION_RE
    if not isinstance(value, str) or not pattern.fullmatch(value):
        limit = 64 if kind == "name" else 32
        return (f"an image {kind}: letters, digits, '.', '_', '-'"
                f"{', +' if kind == 'version' else ''}; at most {limit}, starting with a "
                "letter or digit")  # fmt: skip
    return None


def _head_untrusted(body: bytes) -> Head:
    fields = _unpack(body, MAX_HEAD)
    if not (isinstance(fields, list) and len(fields) == 10 and fields[0] == FORMAT):
        raise BadManifest("not an image head of a known format")
    _, name, version, size, sha, params, table, chunks, created, signer = fields
    for kind, value in (("name", name), ("version", version)):
        if (why := check_name(kind, value)) is not None:
            raise BadManifest(f"{kind} {value!r}: expected {why}")
    if not (_uint(size) and size <= MAX_SIZE and _uint(chunks) and chunks <= MAX_CHUNKS):
        raise BadManifest("size or chunk count out of range")
    if not (isinstance(sha, bytes) and len(sha) == DIGEST and isinstance(table, bytes)
            and len(table) == DIGEST):  # fmt: skip
        raise BadManifest("digests must be 32 bytes")
    if not (isinstance(created, float) and 0 <= created < 1e11):
        raise BadManifest("creation time out of range")
    if not (isinstance(signer, str) and 0 < len(signer) <= 64):
        raise BadManifest("signer missing")
    return Head(name, version, size, sha, _params_untrusted(params), table, chunks, created,
                signer)  # fmt: skip


# -- signing ------------------------------------------------------------------


def public_raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def seal(head: Head, key: Ed25519PrivateKey, cert_der: bytes = b"") -> bytes:
    """``head`` signed: msgpack [format, certificate (b'' for a local key), public key,
    body, signature over DOMAIN + body]."""
    body = head.encode()
    return msgpack.packb(
        [FORMAT, cert_der, public_raw(key.public_key()), body, key.sign(DOMAIN + body)],
        use_bin_type=True,
    )  # fmt: skip


# trust(certificate DER or b"", raw public key, head) -> the key to verify with, or
# raise BadManifest saying why the signer is not trusted
Trust = Callable[[bytes, bytes, Head], Ed25519PublicKey]


def open_untrusted(data: bytes, trust: Trust) -> Head:
    """The head a signed envelope carries, once its signer is trusted and its
    signature verifies; :class:`BadManifest` otherwise."""
    outer = _unpack(data, MAX_HEAD)
    if not (isinstance(outer, list) and len(outer) == 5 and outer[0] == FORMAT
            and all(isinstance(part, bytes) for part in outer[1:])):  # fmt: skip
        raise BadManifest("not a signed image head")
    _, cert_der, public, body, signature = outer
    if len(public) != 32 or len(signature) != 64:
        raise BadManifest("malformed key or signature")
    head = _head_untrusted(body)  # decoded (capped) first: trust may look at the signer
    key = trust(cert_der, public, head)
    try:
        key.verify(signature, DOMAIN + body)
    except InvalidSignature:
        raise BadManifest("the signature does not verify") from None
    return head


# -- deltas -------------------------------------------------------------------

COPY, LITERAL = 0, 1


def diff(old: Table, new: Table) -> list[list[Any]]:
    """``new`` as runs of ``old`` (``[COPY, first index, count]``) and literal chunks
    (``[LITERAL, ids, sizes]``): a few hundred bytes for an edit of a large image."""
    where: dict[bytes, int] = {}
    for i, chunk in enumerate(old.ids):
        where.setdefault(chunk, i)
    ops: list[list[Any]] = []
    literal_ids: list[bytes] = []
    literal_sizes: list[int] = []
    i = 0
    while i < len(new.ids):
        start = where.get(new.ids[i])
        if start is None or old.sizes[start] != new.sizes[i]:
            literal_ids.append(new.ids[i])
            literal_sizes.append(new.sizes[i])
            i += 1
            continue
        if literal_ids:
            ops.append([LITERAL, b"".join(literal_ids),
                        b"".join(_SIZE.pack(n) for n in literal_sizes)])  # fmt: skip
            literal_ids, literal_sizes = [], []
        count = 1
        while (i + count < len(new.ids) and start + count < len(old.ids)
               and old.ids[start + count] == new.ids[i + count]):  # fmt: skip
            count += 1
        ops.append([COPY, start, count])
        i += count
    if literal_ids:
        ops.append([LITERAL, b"".join(literal_ids), b"".join(_SIZE.pack(n) for n in literal_sizes)])
    return ops


def encode_delta(params: Params, ops: list[list[Any]]) -> bytes:
    return msgpack.packb([FORMAT, params.as_list(), ops], use_bin_type=True)


def apply_untrusted(old: Table, delta: bytes, want: bytes) -> Table:
    """The table a delta against ``old`` describes, checked against its digest ``want``."""
    fields = _unpack(delta, MAX_TABLE)
    if not (isinstance(fields, list) and len(fields) == 3 and fields[0] == FORMAT
            and isinstance(fields[2], list)):  # fmt: skip
        raise BadManifest("not a table delta of a known format")
    params = _params_untrusted(fields[1])
    ids: list[bytes] = []
    sizes: list[int] = []
    for op in fields[2]:
        if isinstance(op, list) and len(op) == 3 and op[0] == COPY:
            start, count = op[1], op[2]
            if not (_uint(start) and _uint(count) and count and start + count <= len(old.ids)):
                raise BadManifest("a copy outside the base table")
            ids.extend(old.ids[start : start + count])
            sizes.extend(old.sizes[start : start + count])
        elif isinstance(op, list) and len(op) == 3 and op[0] == LITERAL:
            chunk_ids, chunk_sizes = op[1], op[2]
            if not (isinstance(chunk_ids, bytes) and isinstance(chunk_sizes, bytes)
                    and len(chunk_ids) % DIGEST == 0
                    and len(chunk_sizes) * DIGEST == 4 * len(chunk_ids)):  # fmt: skip
                raise BadManifest("a malformed literal run")
            ids.extend(chunk_ids[i : i + DIGEST] for i in range(0, len(chunk_ids), DIGEST))
            sizes.extend(n for (n,) in _SIZE.iter_unpack(chunk_sizes))
        else:
            raise BadManifest("an unknown delta operation")
        if len(ids) > MAX_CHUNKS:
            raise BadManifest("too many chunks")
    table = Table(params, tuple(ids), tuple(sizes))
    if table.digest() != want:
        raise BadManifest("the rebuilt chunk table does not match its digest")
    return table


# -- helpers ------------------------------------------------------------------


def _unpack(data: bytes, limit: int) -> Any:
    try:
        return unpack_untrusted(data, limit)
    except BadEntry as exc:
        raise BadManifest(str(exc)) from None


def _uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _params_untrusted(raw: Any) -> Params:
    if not (isinstance(raw, list) and len(raw) == 3 and all(_uint(n) for n in raw)):
        raise BadManifest("chunker parameters must be three sizes")
    params = Params(*raw)
    if (why := params.problem()) is not None:
        raise BadManifest(f"chunker parameters: expected {why}")
    return params
