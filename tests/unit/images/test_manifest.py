"""Chunk tables, signed heads and table deltas (plugins/images/manifest.py), no I/O."""

from __future__ import annotations

import dataclasses
import hashlib
import random

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.images.manifest import (
    BadManifest,
    Head,
    Params,
    Table,
    apply_untrusted,
    decode_table_untrusted,
    diff,
    encode_delta,
    open_untrusted,
    public_raw,
    seal,
)

PARAMS = Params(1024, 4096, 16384)


def table(seed: int, n: int) -> Table:
    rng = random.Random(seed)
    ids = tuple(hashlib.sha256(rng.randbytes(8)).digest() for _ in range(n))
    return Table(PARAMS, ids, tuple(rng.randint(1024, 16384) for _ in range(n)))


def head(t: Table, **changes) -> Head:
    base = Head("ubuntu", "1", t.size, b"\x01" * 32, t.params, t.digest(), len(t.ids), 1.7e9,
                "local:0123456789abcdef")  # fmt: skip
    return dataclasses.replace(base, **changes)


def test_a_table_round_trips_and_only_under_its_digest():
    t = table(1, 50)
    data = t.encode()
    assert decode_table_untrusted(data, t.digest()) == t
    with pytest.raises(BadManifest, match="digest"):
        decode_table_untrusted(data, hashlib.sha256(b"other").digest())


@pytest.mark.parametrize(
    ("sizes", "why"),
    [((0, 2000), "chunk 0 has 0 bytes"), ((20000, 2000), "chunk 0 has 20000"),
     ((500, 2000), "chunk 0 has 500"), ((2000, 500), None)],  # only the last may be short
)  # fmt: skip
def test_chunk_sizes_must_fit_the_tables_parameters(sizes, why):
    t = Table(PARAMS, (b"a" * 32, b"b" * 32), sizes)
    data = t.encode()
    if why is None:
        assert decode_table_untrusted(data, t.digest()).sizes == sizes
        return
    with pytest.raises(BadManifest, match=why):
        decode_table_untrusted(data, t.digest())


@pytest.mark.parametrize("params", [[64, 32, 1024], [10, 256, 1024], [64, 256, 1 << 30]])
def test_parameters_pyfastcdc_would_refuse_are_refused(params):
    data = msgpack.packb([1, params, b"", b""])
    with pytest.raises(BadManifest, match="chunker parameters"):
        decode_table_untrusted(data, hashlib.sha256(data).digest())


def signed(h: Head, key: Ed25519PrivateKey) -> bytes:
    return seal(h, key)


def trusting(key: Ed25519PrivateKey):
    def trust(cert_der, public, h):
        if cert_der or public != public_raw(key.public_key()):
            raise BadManifest("untrusted signer")
        return key.public_key()

    return trust


def test_a_head_opens_only_with_a_trusted_key_and_an_intact_signature():
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    h = head(table(2, 10))
    envelope = signed(h, key)
    assert open_untrusted(envelope, trusting(key)) == h
    with pytest.raises(BadManifest, match="untrusted"):
        open_untrusted(signed(h, other), trusting(key))
    # the body changed after signing (a bigger image, same signature)
    outer = msgpack.unpackb(envelope)
    outer[3] = head(table(2, 10), size=h.size + 1).encode()
    with pytest.raises(BadManifest, match="signature"):
        open_untrusted(msgpack.packb(outer), trusting(key))


@pytest.mark.parametrize(
    ("change", "why"),
    [({"name": "../etc"}, "name"), ({"version": ""}, "version"), ({"size": -1}, "range"),
     ({"sha256": b"x"}, "32 bytes"), ({"created": float("nan")}, "time")],
)  # fmt: skip
def test_a_malformed_head_is_refused_even_when_signed(change, why):
    key = Ed25519PrivateKey.generate()
    with pytest.raises(BadManifest, match=why):
        open_untrusted(signed(head(table(3, 4), **change), key), trusting(key))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_garbage_is_refused_never_crashes(data):
    key = Ed25519PrivateKey.generate()
    for decode in (lambda: open_untrusted(data, trusting(key)),
                   lambda: decode_table_untrusted(data, hashlib.sha256(data).digest()),
                   lambda: apply_untrusted(table(4, 3), data, b"\0" * 32)):  # fmt: skip
        with pytest.raises(BadManifest):
            decode()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.tuples(st.integers(0, 199), st.integers(0, 3),
                                                 st.integers(0, 3)), max_size=6))  # fmt: skip
def test_a_delta_rebuilds_the_new_table_exactly(seed, edits):
    old = table(seed, 200)
    ids, sizes = list(old.ids), list(old.sizes)
    fresh = table(seed + 1, 30)
    for k, (at, removed, added) in enumerate(edits):
        at = min(at, len(ids))
        del ids[at : at + removed], sizes[at : at + removed]
        ids[at:at] = fresh.ids[k * 4 : k * 4 + added]
        sizes[at:at] = fresh.sizes[k * 4 : k * 4 + added]
    new = Table(PARAMS, tuple(ids), tuple(sizes))
    delta = encode_delta(new.params, diff(old, new))
    assert apply_untrusted(old, delta, new.digest()) == new
    assert len(delta) <= 80 + len(edits) * (8 + 3 * 36)  # only the edits travel


def test_a_delta_against_the_wrong_base_or_pointing_outside_it_is_refused():
    old, new = table(5, 100), table(6, 100)
    delta = encode_delta(new.params, diff(old, new))
    with pytest.raises(BadManifest, match="digest"):
        apply_untrusted(table(7, 100), encode_delta(old.params, [[0, 0, 100]]), new.digest())
    with pytest.raises(BadManifest, match="outside"):
        apply_untrusted(old, encode_delta(old.params, [[0, 90, 20]]), new.digest())
    assert apply_untrusted(old, delta, new.digest()) == new
