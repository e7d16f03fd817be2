"""The lease table and its journal records."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.dhcp.leases import (
    CorruptRecord,
    Lease,
    LeaseState,
    LeaseTable,
    decode_lease_untrusted,
    encode_lease,
)

A, B = b"\x01" + bytes(6), b"\x01" + bytes([1] * 6)
IP1, IP2 = 0xC0000210, 0xC0000211


def lease(address=IP1, client=A, state=LeaseState.BOUND, expires=100.0, **kw):
    return Lease(address, client, client[1:], "192.0.2.0/24", state, 0.0, expires, **kw)


def test_returning_client_finds_its_address_even_after_expiry():
    table = LeaseTable()
    table.apply(lease())
    assert table.of_client(A).address == IP1
    assert table.expired(now=200.0) == [lease(state=LeaseState.EXPIRED)]
    assert table.get(IP1).state is LeaseState.BOUND  # listed, not applied
    for record in table.expired(now=200.0):
        table.apply(record)
    assert table.of_client(A).state is LeaseState.EXPIRED
    assert table.is_free_for(IP1, B, now=200.0)


def test_address_taken_by_another_client_is_not_free():
    table = LeaseTable()
    table.apply(lease())
    assert not table.is_free_for(IP1, B, now=50.0)
    assert table.is_free_for(IP1, A, now=50.0)
    assert table.is_free_for(IP1, B, now=100.0)  # expired at its end


def test_reassigned_address_forgets_the_previous_client():
    table = LeaseTable()
    table.apply(lease(expires=10.0))
    table.apply(lease(client=B, expires=300.0))
    assert table.of_client(A) is None
    assert table.of_client(B).address == IP1


def test_a_client_moving_releases_its_old_address():
    table = LeaseTable()
    table.apply(lease(IP1))
    table.apply(lease(IP2))
    assert table.get(IP1).state is LeaseState.RELEASED
    assert table.of_client(A).address == IP2
    assert table.is_free_for(IP1, B, now=1.0)


def test_declined_address_is_quarantined_for_everyone():
    table = LeaseTable()
    table.apply(lease(state=LeaseState.DECLINED, expires=500.0))
    assert not table.is_free_for(IP1, A, now=10.0)
    assert not table.is_free_for(IP1, B, now=10.0)
    assert table.of_client(A) is None  # the decliner does not get it back
    assert table.count_active([IP1, IP2], now=10.0) == 1
    assert table.is_free_for(IP1, B, now=500.0)


leases = st.builds(
    Lease,
    st.integers(0, 2**32 - 1),
    st.binary(max_size=64),
    st.binary(max_size=16),
    st.sampled_from(["192.0.2.0/24", "10.0.0.0/8"]),
    st.sampled_from(LeaseState),
    st.floats(0, 2e9),
    st.floats(0, 2e9),
    st.text(max_size=63),
)


@given(leases)
def test_records_round_trip(value):
    assert decode_lease_untrusted(encode_lease(value)) == value


@given(st.binary(max_size=200))
def test_garbage_records_raise_only_corrupt_record(data):
    try:
        decode_lease_untrusted(data)
    except CorruptRecord:
        pass


@pytest.mark.parametrize(
    "fields",
    [
        [2, 1, b"", b"", "", 1, 0.0, 0.0, ""],  # future version
        [1, -1, b"", b"", "", 1, 0.0, 0.0, ""],  # address out of range
        [1, 1, "text", b"", "", 1, 0.0, 0.0, ""],  # client must be bytes
        [1, 1, b"", b"", "", 9, 0.0, 0.0, ""],  # unknown state
        [1, 1, b"", b"", "", 1, 0.0, 0.0],  # short
    ],
)
def test_wrong_shapes_are_corrupt(fields):
    import msgpack

    with pytest.raises(CorruptRecord):
        decode_lease_untrusted(msgpack.packb(fields, use_bin_type=True))


@given(st.lists(leases, max_size=30))
def test_replaying_records_rebuilds_the_same_table(records):
    live, replayed = LeaseTable(), LeaseTable()
    for record in records:
        live.apply(record)
    for record in records:
        replayed.apply(decode_lease_untrusted(encode_lease(record)))
    assert list(live) == list(replayed)
