"""The lock-step fast path (``fast_ack`` / ``ack_next``) is the same transition as
``receive_datagram`` + ``datagrams_to_send``: two machines fed the same inputs, one
taking the shortcut whenever it is offered, send the same datagrams at every step
and end the same way, over a lossy, duplicating, reordering channel."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from plugins.tftp.negotiate import Options
from plugins.tftp.packets import encode_ack, parse_untrusted
from plugins.tftp.transfer import ReadTransfer, TransferComplete, TransferFailed

from .fakeclient import pattern, reader_for
from .test_lossy import simulate


class Twin:
    """Looks like one ReadTransfer; drives two, ``slow`` by the general path and
    ``fast`` by ack_next whenever the datagram is its fast_ack, and checks they agree."""

    taken = 0  # times the shortcut was taken, over every Twin of a test

    def __init__(self, *args, **kwargs) -> None:
        self.slow = ReadTransfer(*args, **kwargs)
        self.fast = ReadTransfer(*args, **kwargs)
        self._fast_out: list[bytes] = []

    def receive_datagram(self, data: bytes, now: float) -> None:
        self.slow.receive_datagram(data, now)
        if data == self.fast.fast_ack:
            self._fast_out.append(self.fast.fast_data)
            self.fast.ack_next(now)
            Twin.taken += 1
        else:
            self.fast.receive_datagram(data, now)

    def datagrams_to_send(self, now: float) -> list[bytes]:
        out = self.slow.datagrams_to_send(now)
        fast_out, self._fast_out = self._fast_out + self.fast.datagrams_to_send(now), []
        assert fast_out == out
        for name in ("done", "bytes_sent", "retransmits", "fast_ack", "fast_data"):
            assert getattr(self.fast, name) == getattr(self.slow, name), name
        assert self.fast.get_timer() == self.slow.get_timer()
        return out

    def handle_timer(self, now: float) -> None:
        self.slow.handle_timer(now)
        self.fast.handle_timer(now)

    def get_timer(self) -> float | None:
        return self.slow.get_timer()

    @property
    def done(self) -> bool:
        return self.slow.done

    def next_event(self):
        event = self.slow.next_event()
        assert self.fast.next_event() == event
        return event


@given(
    size=st.integers(0, 4000),
    blksize=st.sampled_from([8, 16, 512]),
    windowsize=st.sampled_from([1, 1, 1, 2]),  # a window never offers the shortcut
    drop=st.floats(0.0, 0.3),
    dup=st.floats(0.0, 0.3),
    reorder=st.floats(0.0, 0.3),
    reack=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_fast_path_is_the_same_transition(
    size, blksize, windowsize, drop, dup, reorder, reack, seed
):
    event, client, data, _ = simulate(
        size, blksize, windowsize, drop, dup, reorder, seed, reack=reack, machine=Twin
    )
    assert data.startswith(client.data)
    if isinstance(event, TransferComplete):
        assert bytes(client.data) == data


def test_clean_lock_step_takes_the_shortcut_for_every_block_but_the_first():
    Twin.taken = 0
    event, client, data, _ = simulate(100 * 512 + 5, 512, 1, 0.0, 0.0, 0.0, 3, machine=Twin)
    assert isinstance(event, TransferComplete) and bytes(client.data) == data
    assert Twin.taken == 100  # ACK 1..100 (ACK 0 answers the OACK, ACK 101 ends it)


def test_no_shortcut_for_a_window_the_oack_or_the_final_block():
    windowed = ReadTransfer(reader_for(pattern(0, 4096)), 4096, Options(windowsize=4), 0.0)
    windowed.datagrams_to_send(0.0)
    assert windowed.fast_ack is None
    lock_step = ReadTransfer(
        reader_for(pattern(0, 600)), 600, Options(tsize=600, oack=(("tsize", "600"),)), 0.0
    )
    lock_step.datagrams_to_send(0.0)  # the OACK
    assert lock_step.fast_ack is None
    lock_step.receive_datagram(encode_ack(0), 0.0)
    lock_step.datagrams_to_send(0.0)  # block 1
    assert lock_step.fast_ack == encode_ack(1)
    final = parse_untrusted(lock_step.fast_data)  # block 2, 88 bytes: the last, read ahead
    assert (final.block, final.payload) == (2, pattern(512, 88))
    lock_step.ack_next(0.1)
    assert lock_step.fast_ack is None and lock_step.fast_data is None
    assert lock_step.bytes_sent == 600 and lock_step.get_timer() == 1.1


def test_timeout_withdraws_the_shortcut_until_the_resend():
    server = ReadTransfer(reader_for(pattern(0, 2000)), 2000, Options(), 0.0)
    server.datagrams_to_send(0.0)
    assert server.fast_ack == encode_ack(1)
    server.handle_timer(1.0)
    assert server.fast_ack is None
    (resent,) = [parse_untrusted(d) for d in server.datagrams_to_send(1.0)]
    assert resent.block == 1 and server.retransmits == 1
    assert server.fast_ack == encode_ack(1)


def test_a_block_ahead_that_cannot_be_read_fails_when_it_is_due():
    def reader(offset, size):
        if offset:
            raise OSError(5, "Input/output error")
        return pattern(offset, size)

    server = ReadTransfer(reader, 2000, Options(), 0.0)
    (first,) = server.datagrams_to_send(0.0)
    assert parse_untrusted(first).block == 1
    assert server.fast_ack is None  # block 2 could not be read ahead
    assert not server.done
    server.receive_datagram(encode_ack(1), 0.1)
    (error,) = [parse_untrusted(d) for d in server.datagrams_to_send(0.1)]
    assert server.done and error.message == "read error (Input/output error)"
    assert server.next_event() == TransferFailed(0, "read error (Input/output error)")
