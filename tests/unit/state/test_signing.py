"""Signed replication frames: who may sign, and every way a frame is refused."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.cluster import pki
from appliance.state.signing import MAX_FRAME, Refused, open_untrusted, seal

KEY, OTHER = pki.new_key(), pki.new_key()
KEYS = {"a" * 16: KEY.public_key()}


def test_a_frame_opens_with_its_signer():
    frame = seal(["records", 3, [b"x"]], KEY, "a" * 16)
    assert open_untrusted(frame, KEYS.get) == ("a" * 16, ["records", 3, [b"x"]])


def reason(data: bytes) -> str:
    with pytest.raises(Refused) as refused:
        open_untrusted(data, KEYS.get)
    return refused.value.reason


def test_unknown_signers_forgeries_and_garbage_are_refused():
    assert reason(seal(["ack", 1], KEY, "b" * 16)) == "unknown-key"
    assert reason(seal(["ack", 1], OTHER, "a" * 16)) == "signature"
    version, signer, body, signature = msgpack.unpackb(seal(["ack", 1], KEY, "a" * 16))
    tampered = msgpack.packb([version, signer, body[:-1] + b"\x02", signature])
    assert reason(tampered) == "signature"
    assert reason(b"\xc1") == "malformed"
    assert reason(msgpack.packb([2, signer, body, signature])) == "malformed"
    assert reason(b"\x00" * (MAX_FRAME + 1)) == "malformed"


@given(st.binary(max_size=300))
def test_any_bytes_open_or_are_refused(data):
    try:
        open_untrusted(data, KEYS.get)
    except Refused:
        pass
