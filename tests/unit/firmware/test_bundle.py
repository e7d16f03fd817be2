"""Signed update bundles: a good one opens; every tampering, stranger, downgrade and
truncation is refused with a message naming it."""

from __future__ import annotations

import io

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from appliance.firmware import bundle as b
from appliance.firmware.bundle import BadBundle, key_id, make_bundle, read_bundle_untrusted

KEY, STRANGER = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
TRUSTED = {key_id(KEY.public_key()): KEY.public_key()}
PARTS = {"rootfs": b"R" * 5000, "kernel": b"K" * 300, "initrd": b"I" * 700}


def signed(parts=PARTS, version="1.2.0", key=KEY, **extra) -> bytes:
    return make_bundle(parts, version=version, board="x86_64", key=key, created=1.7e9, **extra)


def refusal(data, installed="1.1.0", force=False, board="x86_64") -> str:
    with pytest.raises(BadBundle) as refused:
        read_bundle_untrusted(data, TRUSTED, installed, board, force)
    return str(refused.value)


def test_a_good_bundle_opens_with_its_payloads_where_they_are():
    data = signed()
    opened = read_bundle_untrusted(io.BytesIO(data), TRUSTED, "1.1.0", "x86_64")
    assert opened.manifest.version == "1.2.0"
    assert [p.name for p in opened.manifest.payloads] == ["rootfs", "kernel", "initrd"]
    for name, content in PARTS.items():
        start = opened.offsets[name]
        assert data[start : start + len(content)] == content
    assert read_bundle_untrusted(signed({"rootfs": b"x"}), TRUSTED, None, "x86_64").offsets


def test_tampered_bytes_manifest_and_signature_are_refused():
    data = bytearray(signed())
    data[-1] ^= 1  # the initrd
    assert refusal(bytes(data)) == "payload initrd: its SHA-256 does not match the manifest"
    head_end = len(data) - sum(map(len, PARTS.values()))
    data = bytearray(signed())
    data[head_end + 10] ^= 1  # the root image
    assert "payload rootfs: its SHA-256" in refusal(bytes(data))
    envelope = msgpack.unpackb(signed()[12:head_end])
    manifest = msgpack.unpackb(envelope[2])
    manifest["version"] = "9.9.9"
    forged = [envelope[0], envelope[1], msgpack.packb(manifest), envelope[3]]
    assert "signature does not verify" in refusal(_with_envelope(forged))
    bad_signature = envelope[:3] + [bytes(64)]
    assert "signature does not verify" in refusal(_with_envelope(bad_signature))


def _with_envelope(fields) -> bytes:
    packed = msgpack.packb(fields, use_bin_type=True)
    return b.MAGIC + len(packed).to_bytes(4, "big") + packed + b"".join(PARTS.values())


def test_an_untrusted_key_and_a_lying_signer_are_refused():
    assert "which is not a trusted release key" in refusal(signed(key=STRANGER))
    # Signed by the trusted key but naming another signer inside the manifest
    body = msgpack.packb({"product": "rackboot", "version": "1.2.0", "board": "x86_64",
                          "created": 1.7e9, "signer": "ed25519:0000000000000000",
                          "payloads": [["rootfs", 1, bytes(32)]]})  # fmt: skip
    signer = key_id(KEY.public_key())
    lying = [1, signer, body, KEY.sign(b.DOMAIN + body)]
    assert "the manifest names signer 'ed25519:0000000000000000'" in refusal(_with_envelope(lying))
    other_domain = [1, signer, body, KEY.sign(b"rackboot-state-1\x00" + body)]
    assert "signature does not verify" in refusal(_with_envelope(other_domain))


def test_downgrades_are_refused_unless_forced():
    assert refusal(signed(version="1.0.9")) == (
        "version 1.0.9 is older than the installed 1.1.0 (a downgrade: refused unless forced "
        "with --force)"
    )
    assert read_bundle_untrusted(signed(version="1.0.9"), TRUSTED, "1.1.0", "x86_64", force=True)
    assert "older than the installed 2.0" in refusal(signed(version="2.0rc1"), installed="2.0")
    assert read_bundle_untrusted(signed(version="2.0"), TRUSTED, "2.0rc1", "x86_64")
    assert read_bundle_untrusted(signed(version="1.1"), TRUSTED, "1.1.0", "x86_64")  # same


def test_versions_compare_as_numbers_and_strangers_are_refused():
    key = b.version_key
    assert key("1.10") > key("1.9") > key("1.9rc2") > key("1.9b1") > key("1.9a7") > key("1.8.99")
    for version in ("1.2.dev1", "v1.2", "1.2+local", "", "1..2"):
        with pytest.raises(BadBundle, match="expected digits and dots"):
            key(version)
    with pytest.raises(BadBundle, match="expected digits and dots"):
        signed(version="latest")


def test_wrong_product_board_and_payload_lists_are_refused():
    assert refusal(signed(product="other")) == "a bundle of product 'other', not 'rackboot'"
    assert "this appliance is 'rpi4'" in refusal(signed(), board="rpi4")
    with pytest.raises(BadBundle, match="board 'rpi4': expected one of x86_64"):
        make_bundle(PARTS, version="1.0", board="rpi4", key=KEY, created=0.0)
    with pytest.raises(BadBundle, match="expected rootfs, then optionally kernel and initrd"):
        signed({"kernel": b"k"})


def test_truncation_oversize_and_trailing_bytes_are_refused():
    data = signed()
    assert refusal(data[:-1]) == "truncated bundle: payload initrd ends early"
    assert refusal(data[:20]).startswith("truncated manifest:")
    assert refusal(data[:5]) == "not a Rackboot firmware bundle (magic missing)"
    assert refusal(data + b"x") == "bytes after the last payload the manifest declares"
    huge = b.MAGIC + (b.MAX_ENVELOPE + 1).to_bytes(4, "big")
    assert refusal(huge) == f"manifest of {b.MAX_ENVELOPE + 1} bytes, more than {b.MAX_ENVELOPE}"
    body = msgpack.packb({"product": "rackboot", "version": "1.2.0", "board": "x86_64",
                          "created": 1.7e9, "signer": key_id(KEY.public_key()),
                          "payloads": [["rootfs", b.MAX_PAYLOAD + 1, bytes(32)]]})  # fmt: skip
    oversize = [1, key_id(KEY.public_key()), body, KEY.sign(b.DOMAIN + body)]
    assert "size 1 .. 4294967296" in refusal(_with_envelope(oversize))


@given(st.binary(max_size=200), st.integers(0, 400))
def test_any_bytes_or_any_damage_open_or_are_refused(garbage, position):
    for data in (garbage, b.MAGIC + garbage):
        with pytest.raises(BadBundle):
            read_bundle_untrusted(data, TRUSTED, None, "x86_64")
    damaged = bytearray(signed({"rootfs": b"R" * 200}))
    damaged[position % len(damaged)] ^= 0x40
    with pytest.raises(BadBundle):
        read_bundle_untrusted(bytes(damaged), TRUSTED, None, "x86_64")
