"""The signed update bundle (sans-IO): one file holding a manifest and a slot's payloads.

Layout::

    MAGIC (8 bytes) | envelope length (u32, big-endian) | envelope | payloads, in order

The envelope is msgpack ``[FORMAT, signer, body, signature]``: ``signer`` names
the release key (:func:`key_id`), ``body`` is the msgpack manifest (a map:
product, version, board, created, signer, payloads) and the signature is
Ed25519 over ``DOMAIN + body``. The same shape as the state log's signed
frames (appliance/state/signing.py), with its own domain so that no other
signed object of Rackboot can pass for a bundle. ``payloads`` lists
``[name, size, sha256]``: the root slot's image (``rootfs``), and the kernel
and initrd the boot loader reads from the ESP (``kernel``, ``initrd``).

:func:`read_bundle_untrusted` checks, in this order and naming what is wrong:
the size caps, the envelope's shape, that the signer is trusted, the
signature, the manifest's fields, the product and board, the version against
the installed one (anti-downgrade unless forced), and finally each payload's
size and SHA-256, streamed, so a 512 MiB image is never held in memory.
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from appliance.state.records import BadEntry, unpack_untrusted

MAGIC = b"RBFWBDL\x00"
FORMAT = 1
DOMAIN = b"rackboot-firmware-bundle-1\x00"
PRODUCT = "rackboot"
BOARDS = ("x86_64",)  # image/'s targets (the Pi's tryboot is not handled yet)
PAYLOADS = ("rootfs", "kernel", "initrd")  # in this order; rootfs required
MAX_ENVELOPE = 4096  # a manifest is ~400 bytes; anything larger is not one
MAX_PAYLOAD = 4 << 30  # a root slot is 1 GiB at most; 4 GiB bounds the read
CHUNK = 1 << 20
_LENGTH = struct.Struct(">I")
VERSION_RE = re.compile(r"(\d{1,6}(?:\.\d{1,6}){0,3})(?:(a|b|rc)(\d{1,6}))?")
_PRE_ORDER = {"a": 0, "b": 1, "rc": 2}
_FIELDS = ("product", "version", "board", "created", "signer", "payloads")


class BadBundle(ValueError):
    """A bundle that is refused; the text says what is wrong."""


@dataclass(frozen=True)
class Payload:
    name: str
    size: int
    sha256: bytes


@dataclass(frozen=True)
class Manifest:
    product: str
    version: str
    board: str
    created: float  # unix time the bundle was made
    signer: str  # key_id of the release key
    payloads: tuple[Payload, ...]

    def encode(self) -> bytes:
        fields: dict[str, Any] = {name: getattr(self, name) for name in _FIELDS[:-1]}
        fields["payloads"] = [[p.name, p.size, p.sha256] for p in self.payloads]
        return msgpack.packb(fields, use_bin_type=True)

    def payload(self, name: str) -> Payload | None:
        return next((p for p in self.payloads if p.name == name), None)


@dataclass(frozen=True)
class Bundle:
    manifest: Manifest
    offsets: dict[str, int]  # payload name -> where it starts in the bundle file


def public_raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    """The name a release key is trusted under: its raw key's SHA-256, shortened."""
    return "ed25519:" + hashlib.sha256(public_raw(public)).hexdigest()[:16]


def version_key(version: str) -> tuple[tuple[int, ...], int, int]:
    """A sortable key of a version: PEP 440's release and pre-release subset
    (``1.2``, ``1.2.3``, ``2.0rc1``); a pre-release sorts before its release.
    Raises :class:`BadBundle` for anything else (no local or dev parts: a
    firmware version must compare one way only)."""
    match = VERSION_RE.fullmatch(version) if isinstance(version, str) else None
    if match is None:
        raise BadBundle(f"version {version!r}: expected digits and dots, optionally "
                        "followed by a1, b1 or rc1 (e.g. 1.4.0, 2.0rc1)")  # fmt: skip
    release = tuple(int(n) for n in match[1].split("."))
    release += (0,) * (4 - len(release))  # 1.2 == 1.2.0
    pre = (_PRE_ORDER[match[2]], int(match[3])) if match[2] else (3, 0)
    return release, *pre


def bundle_head(payloads: list[Payload], *, version: str, board: str, key: Ed25519PrivateKey,
                created: float, product: str = PRODUCT) -> bytes:  # fmt: skip
    """The bytes before the payloads of a bundle signed with the release key
    ``key``; the payloads follow in the order given (the shell streams them)."""
    version_key(version)  # refuse to sign what no appliance would accept
    if board not in BOARDS:
        raise BadBundle(f"board {board!r}: expected one of {', '.join(BOARDS)}")
    _check_payload_list(payloads)
    signer = key_id(key.public_key())
    manifest = Manifest(product, version, board, float(created), signer, tuple(payloads))
    body = manifest.encode()
    envelope = msgpack.packb([FORMAT, signer, body, key.sign(DOMAIN + body)], use_bin_type=True)
    return MAGIC + _LENGTH.pack(len(envelope)) + envelope


def make_bundle(parts: Mapping[str, bytes], **manifest: Any) -> bytes:
    """A whole bundle in memory (tests, small images): ``parts`` maps payload
    names to their bytes; ``manifest`` as :func:`bundle_head` takes it."""
    names = [name for name in PAYLOADS if name in parts] + [n for n in parts if n not in PAYLOADS]
    payloads = [Payload(n, len(parts[n]), hashlib.sha256(parts[n]).digest()) for n in names]
    return bundle_head(payloads, **manifest) + b"".join(parts[n] for n in names)


def read_bundle_untrusted(
    source: bytes | BinaryIO,
    trusted_keys: Mapping[str, Ed25519PublicKey],
    installed_version: str | None,
    board: str,
    force: bool = False,
) -> Bundle:
    """The checked manifest of a bundle (bytes, or a binary file positioned at
    its start); :class:`BadBundle` naming the problem otherwise. ``trusted_keys``
    maps :func:`key_id` to the release keys the operator configured;
    ``installed_version`` None (unknown) skips the anti-downgrade check."""
    stream = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    head = stream.read(len(MAGIC) + _LENGTH.size)
    if len(head) < len(MAGIC) + _LENGTH.size or head[: len(MAGIC)] != MAGIC:
        raise BadBundle("not a Rackboot firmware bundle (magic missing)")
    (length,) = _LENGTH.unpack_from(head, len(MAGIC))
    if length > MAX_ENVELOPE:
        raise BadBundle(f"manifest of {length} bytes, more than {MAX_ENVELOPE}")
    envelope = stream.read(length)
    if len(envelope) != length:
        raise BadBundle(f"truncated manifest: {len(envelope)} of {length} bytes")
    manifest = _open_envelope(envelope, trusted_keys)
    _check_target(manifest, installed_version, board, force)
    offsets, offset = {}, len(head) + length
    for payload in manifest.payloads:
        offsets[payload.name] = offset
        _check_payload(stream, payload)
        offset += payload.size
    if stream.read(1):
        raise BadBundle("bytes after the last payload the manifest declares")
    return Bundle(manifest, offsets)


def _open_envelope(envelope: bytes, trusted_keys: Mapping[str, Ed25519PublicKey]) -> Manifest:
    outer = _unpack(envelope, "manifest envelope")
    if not (isinstance(outer, list) and len(outer) == 4 and outer[0] == FORMAT
            and isinstance(outer[1], str) and isinstance(outer[2], bytes)
            and isinstance(outer[3], bytes) and len(outer[3]) == 64):  # fmt: skip
        raise BadBundle("manifest envelope: not [format 1, signer, body, 64-byte signature]")
    _, signer, body, signature = outer
    public = trusted_keys.get(signer)
    if public is None:
        raise BadBundle(f"signed by {signer[:40]!r}, which is not a trusted release key "
                        "(firmware.trusted_keys)")  # fmt: skip
    try:
        public.verify(signature, DOMAIN + body)
    except InvalidSignature:
        raise BadBundle(f"the manifest's signature does not verify with {signer}") from None
    manifest = _manifest_untrusted(_unpack(body, "manifest"))
    if manifest.signer != signer:
        raise BadBundle(f"the manifest names signer {manifest.signer!r}, the envelope {signer!r}")
    return manifest


def _manifest_untrusted(fields: Any) -> Manifest:
    if not (isinstance(fields, dict) and sorted(fields) == sorted(_FIELDS)):
        raise BadBundle(f"manifest: expected exactly the fields {', '.join(_FIELDS)}")
    for name in ("product", "version", "board", "signer"):
        if not (isinstance(fields[name], str) and 0 < len(fields[name]) <= 64):
            raise BadBundle(f"manifest field {name}: expected a string of 1 to 64 characters")
    created = fields["created"]
    if not (isinstance(created, float) and 0 <= created < 1e11):
        raise BadBundle("manifest field created: expected a unix time")
    version_key(fields["version"])
    raw = fields["payloads"]
    if not (isinstance(raw, list) and 0 < len(raw) <= len(PAYLOADS)):
        raise BadBundle(f"manifest field payloads: expected 1 to {len(PAYLOADS)} entries")
    payloads = [_payload_untrusted(item) for item in raw]
    _check_payload_list(payloads)
    return Manifest(**{**fields, "payloads": tuple(payloads)})


def _payload_untrusted(item: Any) -> Payload:
    if not (isinstance(item, list) and len(item) == 3 and item[0] in PAYLOADS
            and isinstance(item[1], int) and not isinstance(item[1], bool)
            and 0 < item[1] <= MAX_PAYLOAD
            and isinstance(item[2], bytes) and len(item[2]) == 32):  # fmt: skip
        raise BadBundle(f"manifest payload: expected [one of {', '.join(PAYLOADS)}, "
                        f"size 1 .. {MAX_PAYLOAD}, 32-byte SHA-256]")  # fmt: skip
    return Payload(*item)


def _check_payload_list(payloads: list[Payload]) -> None:
    names = [p.name for p in payloads]
    if (
        not names
        or names[0] != "rootfs"
        or names != sorted(names, key=PAYLOADS.index)
        or len(set(names)) != len(names)
    ):
        raise BadBundle(f"payloads {names}: expected rootfs, then optionally kernel and initrd, "
                        "each once, in that order")  # fmt: skip


def _check_target(m: Manifest, installed: str | None, board: str, force: bool) -> None:
    if m.product != PRODUCT:
        raise BadBundle(f"a bundle of product {m.product!r}, not {PRODUCT!r}")
    if m.board != board:
        raise BadBundle(f"a bundle for board {m.board!r}; this appliance is {board!r}")
    if installed is not None and version_key(m.version) < version_key(installed) and not force:
        raise BadBundle(f"version {m.version} is older than the installed {installed} "
                        "(a downgrade: refused unless forced with --force)")  # fmt: skip


def _check_payload(stream: BinaryIO, payload: Payload) -> None:
    digest = hash_stream(stream, payload.size)
    if digest is None:
        raise BadBundle(f"truncated bundle: payload {payload.name} ends early")
    if digest != payload.sha256:
        raise BadBundle(f"payload {payload.name}: its SHA-256 does not match the manifest")


def hash_stream(stream: BinaryIO, size: int) -> bytes | None:
    """SHA-256 of the next ``size`` bytes of ``stream``, read in chunks (None:
    the stream ended first)."""
    digest, left = hashlib.sha256(), size
    for _ in range(size // CHUNK + 1):  # bounded by the declared size
        if left == 0:
            break
        chunk = stream.read(min(CHUNK, left))
        if not chunk:
            break
        digest.update(chunk)
        left -= len(chunk)
    return None if left else digest.digest()


def _unpack(data: bytes, what: str) -> Any:
    try:
        return unpack_untrusted(data, MAX_ENVELOPE)
    except BadEntry as exc:
        raise BadBundle(f"{what}: {exc}") from None
