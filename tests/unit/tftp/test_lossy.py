"""Seeded lossy-network simulation: drop, duplicate, reorder and delay both ways."""

from __future__ import annotations

import heapq
import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.tftp.negotiate import negotiate
from plugins.tftp.packets import ErrorCode
from plugins.tftp.transfer import ReadTransfer, TransferComplete, TransferFailed

from .fakeclient import FakeClient, pattern, reader_for


def simulate(
    size, blksize, windowsize, drop, dup, reorder, seed, *, retries=5, reack=False, reader=None,
    machine=ReadTransfer,
):  # fmt: skip
    """Run one transfer to its end over a network with 10 ms latency that drops,
    duplicates, and delays a ``reorder`` fraction of datagrams by up to a second
    (so they overtake); returns (event, client, data, steps). ``machine`` builds the
    server (ReadTransfer's signature)."""
    rng = random.Random(seed)
    data = pattern(0, size) if reader is None else None
    options = negotiate(
        {"blksize": str(blksize), "windowsize": str(windowsize)},
        file_size=size,
        max_blksize=1468,
    )
    server = machine(reader or reader_for(data), size, options, 0.0, retries=retries)
    client = FakeClient(blksize, windowsize, timeout=1.3, reack_duplicates=reack)
    in_flight: list = []
    order = itertools.count()
    now = 0.0

    def transmit(datagrams, to_client):
        for datagram in datagrams:
            if rng.random() < drop:
                continue
            for _ in range(2 if rng.random() < dup else 1):
                arrival = now + 0.01 + (rng.uniform(0, 1) if rng.random() < reorder else 0)
                heapq.heappush(in_flight, (arrival, next(order), to_client, datagram))

    # Every round trip either progresses or spends one of the server's bounded retries.
    blocks = size // blksize + 2
    bound = 200 * blocks * (retries + 1) * (windowsize + 2)
    steps = 0
    transmit(server.datagrams_to_send(now), True)
    while not server.done:
        steps += 1
        assert steps < bound
        timers = [t for t in (server.get_timer(), client.timer) if t is not None]
        if in_flight and in_flight[0][0] <= min(timers):
            now, _, to_client, datagram = heapq.heappop(in_flight)
            if to_client:
                client.receive(datagram, now)
            else:
                server.receive_datagram(datagram, now)
        else:
            now = min(timers)
            server.handle_timer(now)
            client.handle_timer(now)
        transmit(server.datagrams_to_send(now), True)
        transmit(client.take(), False)
    assert server.datagrams_to_send(now) == []
    event = server.next_event()
    assert server.next_event() is None
    return event, client, data, steps


@given(
    size=st.integers(0, 3000),
    blksize=st.sampled_from([8, 16, 512]),
    windowsize=st.integers(1, 8),
    drop=st.floats(0.0, 0.3),
    dup=st.floats(0.0, 0.3),
    reorder=st.floats(0.0, 0.3),
    reack=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_lossy_channel_never_corrupts(size, blksize, windowsize, drop, dup, reorder, reack, seed):
    event, client, data, _ = simulate(
        size, blksize, windowsize, drop, dup, reorder, seed, reack=reack
    )
    assert data.startswith(client.data)  # whatever arrived is the file, in order
    if isinstance(event, TransferComplete):
        assert client.complete and bytes(client.data) == data
        assert event.bytes_sent == size
    else:
        assert event == TransferFailed(ErrorCode.NOT_DEFINED, "timed out")
        assert client.error is None  # a timeout is not announced


@pytest.mark.parametrize("reack", [False, True])
def test_moderate_loss_completes(reack):
    for seed in range(20):
        event, client, data, _ = simulate(
            20_000, 512, 4, 0.1, 0.1, 0.1, seed, retries=8, reack=reack
        )
        assert isinstance(event, TransferComplete) and bytes(client.data) == data


def test_clean_channel_has_no_retransmits():
    event, client, data, _ = simulate(5000, 16, 8, 0.0, 0.0, 0.0, 1)
    assert event == TransferComplete(5000, 0) and bytes(client.data) == data


def test_lossy_window_across_the_block_number_wrap():
    size = 8 * 65560  # 65561 blocks of 8 bytes, generated from the offset
    event, client, _, _ = simulate(size, 8, 16, 0.01, 0.02, 0.002, 7, retries=8, reader=pattern)
    assert event.__class__ is TransferComplete and event.bytes_sent == size
    assert client.data == pattern(0, size)
