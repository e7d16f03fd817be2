"""Release keys and bundle signing, for the build side (`rackboot firmware keygen|bundle`)
and the appliance's list of trusted keys."""

from __future__ import annotations

import base64
import binascii
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from appliance.errors import RackbootError
from appliance.firmware.bundle import (
    PAYLOADS,
    BadBundle,
    Payload,
    bundle_head,
    hash_stream,
    key_id,
    public_raw,
)

PREFIX = "ed25519:"
MAX_KEYS_FILE = 64 * 1024


def public_text(key: Ed25519PublicKey) -> str:
    """A release key as the configuration names it: ``ed25519:`` + base64 of the raw key."""
    return PREFIX + base64.b64encode(public_raw(key)).decode()


def parse_public(text: str, where: str) -> Ed25519PublicKey:
    try:
        raw = base64.b64decode(text.removeprefix(PREFIX), validate=True)
        if not text.startswith(PREFIX) or len(raw) != 32:
            raise ValueError
        return Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, binascii.Error):
        raise RackbootError(f"{where}: {text[:60]!r} is not a release key "
                            "('ed25519:' + 44 base64 characters)") from None  # fmt: skip


def trusted_keys(configured: Iterable[str], keys_file: Path) -> dict[str, Ed25519PublicKey]:
    """The keys of ``[firmware] trusted_keys`` and of the image's own keys file
    (one a line, ``#`` comments), by key id."""
    keys = [parse_public(text, "firmware.trusted_keys") for text in configured]
    try:
        with open(keys_file, encoding="ascii", errors="replace") as fh:
            lines = fh.read(MAX_KEYS_FILE).splitlines()
    except FileNotFoundError:
        lines = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if text:
            keys.append(parse_public(text, f"{keys_file} line {number}"))
    return {key_id(k): k for k in keys}


def keygen(path: Path) -> Ed25519PrivateKey:
    """A new release key, written to ``path`` (PEM, mode 0600, never over another)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise RackbootError(f"{path} exists: a release key is never overwritten") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    return key


def load_private(path: Path) -> Ed25519PrivateKey:
    try:
        key = load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as exc:
        raise RackbootError(f"release key {path}: {exc.strerror}") from None
    except (ValueError, TypeError):
        raise RackbootError(f"release key {path}: not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise RackbootError(f"release key {path}: not an Ed25519 key")
    return key


def write_bundle(out: Path, files: dict[str, Path], *, version: str, board: str,
                 key: Ed25519PrivateKey, created: float | None = None) -> None:  # fmt: skip
    """The bundle of ``files`` (payload name -> file), streamed: hashed once,
    then copied after the signed head."""
    payloads = []
    for name in PAYLOADS:
        if name in files:
            with open(files[name], "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                digest = hash_stream(fh, size)
            if digest is None:
                raise RackbootError(f"{files[name]} changed while it was read")
            payloads.append(Payload(name, size, digest))
    try:
        head = bundle_head(payloads, version=version, board=board, key=key,
                           created=time.time() if created is None else created)  # fmt: skip
    except BadBundle as exc:
        raise RackbootError(str(exc)) from None
    temporary = out.with_name(f".{out.name}.tmp")
    with open(temporary, "wb") as fh:
        fh.write(head)
        for payload in payloads:
            with open(files[payload.name], "rb") as part:
                shutil.copyfileobj(part, fh, 1 << 20)
    os.replace(temporary, out)
