"""The read-transfer machine driven by a fake client with explicit time."""

from __future__ import annotations

import hashlib

import pytest

from plugins.tftp.negotiate import Options, negotiate
from plugins.tftp.packets import (
    Ack,
    Data,
    Error,
    ErrorCode,
    Opcode,
    OptionAck,
    encode_ack,
    encode_data,
    encode_error,
    encode_oack,
    encode_request,
    parse_untrusted,
)
from plugins.tftp.transfer import ReadTransfer, TransferComplete, TransferFailed

from .fakeclient import FakeClient, pattern, reader_for


def drive(server, client, now=0.0, lose=lambda datagram: False, limit=10_000_000):
    """Perfect network, except datagrams for which ``lose`` is true; time stands still
    unless someone has to time out."""
    steps = 0
    while not server.done:
        steps += 1
        assert steps < limit
        sent = server.datagrams_to_send(now)
        for datagram in sent:
            if not lose(datagram):
                client.receive(datagram, now)
        acks = client.take()
        for datagram in acks:
            if not lose(datagram):
                server.receive_datagram(datagram, now)
        if not sent and not acks and not server.done:
            now = min(t for t in (server.get_timer(), client.timer) if t is not None)
            server.handle_timer(now)
            client.handle_timer(now)
    server.datagrams_to_send(now)
    return server.next_event()


def packets(transfer, now):
    return [parse_untrusted(d) for d in transfer.datagrams_to_send(now)]


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 5 * 512])
def test_plain_transfer(size):
    data = pattern(0, size)
    server = ReadTransfer(reader_for(data), size, Options(), 0.0)
    first = packets(server, 0.0)
    assert first == [Data(1, data[:512])]  # no OACK without options
    server.receive_datagram(encode_ack(1), 0.0)
    client = FakeClient()
    client.next, client.data = 2, bytearray(data[:512])
    if size < 512:
        assert server.next_event() == TransferComplete(size, 0)
        return
    assert drive(server, client) == TransferComplete(size, 0)
    assert bytes(client.data) == data
    assert client.received == size // 512  # one DATA per block, the final one short or empty


def test_oack_path_with_blksize_tsize_windowsize():
    data = pattern(0, 10_000)
    options = negotiate(
        {"blksize": "1024", "tsize": "0", "windowsize": "4"}, file_size=len(data), max_blksize=1468
    )
    server = ReadTransfer(reader_for(data), len(data), options, 0.0)
    assert packets(server, 0.0) == [
        OptionAck({"blksize": "1024", "tsize": "10000", "windowsize": "4"})
    ]
    assert packets(server, 0.0) == []  # nothing until ACK 0
    server.receive_datagram(encode_ack(0), 0.1)
    assert [p.block for p in packets(server, 0.1)] == [1, 2, 3, 4]
    client = FakeClient(blksize=1024, windowsize=4)
    client.next, client.data = 5, bytearray(data[:4096])
    server.receive_datagram(encode_ack(4), 0.2)
    assert drive(server, client, 0.2) == TransferComplete(10_000, 0)
    assert bytes(client.data) == data


def test_client_refusing_the_oack_stops_quietly():
    options = negotiate({"blksize": "1024"}, file_size=5, max_blksize=1468)
    server = ReadTransfer(reader_for(b"hello"), 5, options, 0.0)
    packets(server, 0.0)
    server.receive_datagram(encode_error(ErrorCode.OPTION_REFUSED, "no thanks"), 0.1)
    assert server.done and server.get_timer() is None
    assert server.datagrams_to_send(0.1) == []
    assert server.next_event() == TransferFailed(8, "no thanks", remote=True)


def test_duplicate_and_old_acks_never_trigger_sends():
    server = ReadTransfer(reader_for(pattern(0, 4000)), 4000, Options(), 0.0)
    packets(server, 0.0)
    server.receive_datagram(encode_ack(1), 0.0)
    assert [p.block for p in packets(server, 0.0)] == [2]
    for ack in (1, 1, 0, 60000):  # duplicate, older, stray
        server.receive_datagram(encode_ack(ack), 0.0)
        assert server.datagrams_to_send(0.0) == []
    assert server.retransmits == 0


def test_window_ack_inside_window_restarts_after_it_once():
    options = Options(blksize=8, windowsize=4, oack=(("windowsize", "4"),))
    server = ReadTransfer(reader_for(pattern(0, 200)), 200, options, 0.0)
    packets(server, 0.0)
    server.receive_datagram(encode_ack(0), 0.0)
    assert [p.block for p in packets(server, 0.0)] == [1, 2, 3, 4]
    server.receive_datagram(encode_ack(2), 0.0)  # 3 was lost
    assert [p.block for p in packets(server, 0.0)] == [3, 4, 5, 6]
    assert server.retransmits == 2
    for _ in range(3):  # the client re-ACKs 2 for each out-of-order block
        server.receive_datagram(encode_ack(2), 0.0)
    assert server.datagrams_to_send(0.0) == []
    server.receive_datagram(encode_ack(6), 0.0)
    assert [p.block for p in packets(server, 0.0)] == [7, 8, 9, 10]


def timeout_gaps(server, now):
    """Let every timer fire until the transfer ends: the gaps between them, and what
    the last timer sent."""
    gaps, sent = [], None
    while not server.done:
        deadline = server.get_timer()
        gaps.append(deadline - now)
        now = deadline
        server.handle_timer(now)
        sent = server.datagrams_to_send(now)
    return gaps, sent


def test_timeouts_back_off_exponentially_then_give_up():
    server = ReadTransfer(reader_for(b"x" * 1000), 1000, Options(), 10.0, retries=5)
    assert packets(server, 10.0) == [Data(1, b"x" * 512)]
    server.receive_datagram(encode_ack(1), 10.0)  # the client is there: the full retries
    assert packets(server, 10.0) == [Data(2, b"x" * 488)]
    assert server.verified and server.get_timer() == 11.0
    server.handle_timer(10.9)  # early: nothing
    assert server.datagrams_to_send(10.9) == []
    gaps, sent = timeout_gaps(server, 10.0)
    assert gaps == [1, 2, 4, 8, 8, 8]  # capped at max_timeout
    assert server.retransmits == 5
    assert server.next_event() == TransferFailed(ErrorCode.NOT_DEFINED, "timed out")
    assert sent == []  # no ERROR to a client that hears nothing


def test_a_transfer_never_acknowledged_gives_up_after_two_retransmissions():
    """Its source may be forged (a flood of RRQs): the slot is freed after 7 s, not 31."""
    server = ReadTransfer(reader_for(b"x" * 1000), 1000, Options(), 0.0, retries=5)
    assert packets(server, 0.0) == [Data(1, b"x" * 512)]
    gaps, sent = timeout_gaps(server, 0.0)
    assert gaps == [1, 2, 4] and server.retransmits == 2 and sent == []
    assert not server.verified
    assert server.next_event() == TransferFailed(ErrorCode.NOT_DEFINED, "timed out")


def test_an_acknowledged_oack_verifies_the_client():
    options = negotiate({"blksize": "1024"}, file_size=5000, max_blksize=1468)
    server = ReadTransfer(reader_for(b"x" * 5000), 5000, options, 0.0, retries=4)
    packets(server, 0.0)
    assert not server.verified
    server.receive_datagram(encode_ack(0), 0.5)
    assert server.verified
    assert packets(server, 0.5) == [Data(1, b"x" * 1024)]
    gaps, _ = timeout_gaps(server, 0.5)
    assert len(gaps) == 5  # retries=4: the verified limit


def test_unverified_retries_never_exceed_retries():
    server = ReadTransfer(reader_for(b"x"), 1, Options(), 0.0, retries=1, unverified_retries=3)
    packets(server, 0.0)
    assert timeout_gaps(server, 0.0)[0] == [1, 2]


def test_evicting_an_unverified_transfer_sends_nothing():
    server = ReadTransfer(reader_for(b"x" * 1000), 1000, Options(), 0.0)
    packets(server, 0.0)
    server.evict()
    assert server.done and server.datagrams_to_send(0.1) == [] and server.get_timer() is None
    assert server.next_event() == TransferFailed(ErrorCode.NOT_DEFINED, "evicted")


def test_evicting_a_verified_transfer_tells_the_client():
    server = ReadTransfer(reader_for(b"x" * 1000), 1000, Options(), 0.0)
    packets(server, 0.0)
    server.receive_datagram(encode_ack(1), 0.1)
    server.evict()
    assert packets(server, 0.1) == [Error(ErrorCode.NOT_DEFINED, "server busy, try again later")]
    assert server.done and server.fast_ack is None
    server.evict()  # once ended, nothing more
    assert server.datagrams_to_send(0.2) == []


def test_timeout_option_sets_the_base_and_progress_resets_backoff():
    options = Options(timeout=3, oack=(("timeout", "3"),))
    server = ReadTransfer(reader_for(b"x" * 2000), 2000, options, 0.0)
    assert packets(server, 0.0) == [OptionAck({"timeout": "3"})]
    assert server.get_timer() == 3.0
    server.handle_timer(3.0)
    assert packets(server, 3.0) == [OptionAck({"timeout": "3"})]  # OACK is retransmitted too
    assert server.get_timer() == 9.0
    server.receive_datagram(encode_ack(0), 4.0)
    packets(server, 4.0)
    assert server.get_timer() == 7.0


def test_lost_data_and_lost_ack_recover_by_timeout():
    data = pattern(0, 3000)
    server = ReadTransfer(reader_for(data), len(data), Options(), 0.0)
    client = FakeClient()
    dropped = set()

    def lose(datagram):  # the first DATA 3 and the first ACK 5 vanish
        if datagram in (encode_data(3, data[1024:1536]), encode_ack(5)) and datagram not in dropped:
            dropped.add(datagram)
            return True
        return False

    event = drive(server, client, lose=lose)
    assert len(dropped) == 2
    assert event == TransferComplete(3000, 2)
    assert bytes(client.data) == data


def test_error_from_client_mid_transfer_fails_without_reply():
    server = ReadTransfer(reader_for(pattern(0, 3000)), 3000, Options(), 0.0)
    packets(server, 0.0)
    server.receive_datagram(encode_error(ErrorCode.DISK_FULL, "full"), 0.5)
    assert server.datagrams_to_send(0.5) == []
    assert server.next_event() == TransferFailed(3, "full", remote=True)
    server.receive_datagram(encode_ack(1), 0.6)  # after the end: ignored
    assert server.datagrams_to_send(0.6) == [] and server.next_event() is None


@pytest.mark.parametrize(
    "datagram",
    [
        encode_data(1, b"x"),
        encode_request(Opcode.RRQ, "f"),
        encode_request(Opcode.WRQ, "f"),
        encode_oack({"blksize": "8"}),
    ],
)
def test_other_packet_types_get_error_4(datagram):
    server = ReadTransfer(reader_for(b"abc"), 3, Options(), 0.0)
    packets(server, 0.0)
    server.receive_datagram(datagram, 0.1)
    assert packets(server, 0.1) == [Error(4, "illegal TFTP operation")]
    assert server.next_event() == TransferFailed(
        ErrorCode.ILLEGAL_OPERATION, "illegal TFTP operation"
    )
    assert server.done


def test_malformed_datagrams_are_counted_and_dropped():
    server = ReadTransfer(reader_for(b"abc"), 3, Options(), 0.0)
    packets(server, 0.0)
    for junk in (b"", b"\0\x04\0", b"\0\x09\0\0"):
        server.receive_datagram(junk, 0.1)
    assert server.malformed == 3 and not server.done
    assert server.datagrams_to_send(0.1) == []


def test_acks_read_as_the_codec_reads_them():
    """receive_datagram reads ACKs without the codec (hot path): it must agree with
    parse_untrusted on trailing bytes (accepted) and oversized datagrams (malformed)."""
    from plugins.tftp.packets import MAX_PACKET

    data = pattern(0, 1200)
    server = ReadTransfer(reader_for(data), len(data), Options(), 0.0)
    assert [p.block for p in packets(server, 0.0)] == [1]
    oversized = encode_ack(1) + bytes(MAX_PACKET)
    with pytest.raises(Exception, match="longer"):
        parse_untrusted(oversized)
    server.receive_datagram(oversized, 0.1)
    assert server.malformed == 1 and packets(server, 0.1) == []
    trailing = encode_ack(1) + b"junk"
    assert parse_untrusted(trailing) == Ack(1)
    server.receive_datagram(trailing, 0.2)
    assert [p.block for p in packets(server, 0.2)] == [2]


def checksum(reader, size):
    digest = hashlib.sha256()
    for offset in range(0, size, 1 << 16):
        digest.update(reader(offset, min(1 << 16, size - offset)))
    return digest.hexdigest()


@pytest.mark.parametrize("windowsize", [1, 16])
def test_block_numbers_roll_over_past_65535(windowsize):
    size = 8 * 65540 + 3  # 65541 blocks at blksize 8
    options = Options(blksize=8, windowsize=windowsize, oack=(("blksize", "8"),))
    server = ReadTransfer(pattern, size, options, 0.0)
    client = FakeClient(blksize=8, windowsize=windowsize)
    wire = []

    def lose(datagram):
        packet = parse_untrusted(datagram)
        if isinstance(packet, Data) and 65533 <= client.next <= 65539:
            wire.append(packet.block)
        return False

    assert drive(server, client, lose=lose) == TransferComplete(size, 0)
    assert 65535 in wire and wire[wire.index(65535) + 1] == 0  # 65536 goes out as 0
    assert checksum(lambda o, n: bytes(client.data[o : o + n]), size) == checksum(pattern, size)


def test_acks_across_the_wrap_map_to_the_current_window():
    size = 8 * 65600
    options = Options(blksize=8, windowsize=6, oack=(("windowsize", "6"),))
    server = ReadTransfer(pattern, size, options, 0.0)
    client = FakeClient(blksize=8, windowsize=6)
    # Fast-forward with a perfect client to the window 65533..65538, which straddles the wrap.
    while client.next != 65533:
        for datagram in server.datagrams_to_send(0.0):
            client.receive(datagram, 0.0)
        for datagram in client.take():
            server.receive_datagram(datagram, 0.0)
    assert [p.block for p in packets(server, 0.0)] == [65533, 65534, 65535, 0, 1, 2]
    server.receive_datagram(encode_ack(65530), 0.0)  # stale ACK of an acknowledged block
    assert server.datagrams_to_send(0.0) == []
    server.receive_datagram(encode_ack(0), 0.0)  # block 65536 arrived, 65537 was lost
    assert [p.block for p in packets(server, 0.0)] == [1, 2, 3, 4, 5, 6]
    server.receive_datagram(encode_ack(65535), 0.0)  # older than acked: ignored
    server.receive_datagram(encode_ack(7), 0.0)  # beyond what was sent: ignored
    assert server.datagrams_to_send(0.0) == []
    server.receive_datagram(encode_ack(6), 0.0)
    assert [p.block for p in packets(server, 0.0)] == [7, 8, 9, 10, 11, 12]
    assert server.retransmits == 2  # blocks 65537 and 65538 went out twice


NETASCII = [
    (b"", b""),
    (b"a\nb", b"a\r\nb"),
    (b"a\rb", b"a\r\0b"),
    (b"a\r\nb\n\n\r", b"a\r\0\r\nb\r\n\r\n\r\0"),
    (b"\n" * 20, b"\r\n" * 20),  # 40 bytes: five full blocks at blksize 8, then an empty one
    (b"1234567\n", b"1234567\r\n"),  # the CR LF pair straddles a block boundary
]


@pytest.mark.parametrize(("source", "sent"), NETASCII)
def test_netascii_converts_line_ends_on_the_fly(source, sent):
    server = ReadTransfer(reader_for(source), len(source), Options(blksize=8), 0.0, netascii=True)
    client = FakeClient(blksize=8)
    assert drive(server, client) == TransferComplete(len(sent), 0)
    assert bytes(client.data) == sent
    assert client.received == len(sent) // 8 + 1


def test_netascii_with_unknown_size():
    source = b"line one\nline two\n" * 50
    server = ReadTransfer(reader_for(source), None, Options(blksize=16), 0.0, netascii=True)
    client = FakeClient(blksize=16)
    assert isinstance(drive(server, client), TransferComplete)
    assert bytes(client.data) == source.replace(b"\n", b"\r\n")


def test_reads_stream_each_block_once_and_cache_stays_within_a_window():
    calls = []
    size = 50 * 512 + 7

    def reader(offset, n):
        calls.append((offset, n))
        return pattern(offset, n)

    options = Options(windowsize=4, oack=(("windowsize", "4"),))
    server = ReadTransfer(reader, size, options, 0.0)
    client = FakeClient(windowsize=4)
    lost = set()

    def lose(datagram):  # lose block 10 once: the window is resent from the cache
        if datagram[:4] == b"\0\x03\0\x0a" and not lost:
            lost.add(1)
            return True
        assert len(server._cache) <= 4
        return False

    assert isinstance(drive(server, client, lose=lose), TransferComplete)
    assert [offset for offset, _ in calls] == list(range(0, size + 1, 512))
    assert bytes(client.data) == pattern(0, size)


def test_unknown_size_ends_at_first_short_read():
    server = ReadTransfer(reader_for(b"z" * 1024), None, Options(), 0.0)
    client = FakeClient()
    assert drive(server, client) == TransferComplete(1024, 0)
    assert client.received == 3  # exact multiple: an empty final block


def test_read_error_sends_error_0():
    def reader(offset, n):
        if offset:
            raise OSError(5, "Input/output error", "/srv/tftp/secret/path")
        return b"a" * n

    server = ReadTransfer(reader, 2000, Options(), 0.0)
    packets(server, 0.0)
    server.receive_datagram(encode_ack(1), 0.1)
    assert packets(server, 0.1) == [Error(0, "read error (Input/output error)")]
    assert server.next_event() == TransferFailed(0, "read error (Input/output error)")


def test_file_shrinking_under_us_fails_instead_of_sending_a_short_file():
    server = ReadTransfer(reader_for(b"a" * 700), 2000, Options(), 0.0)
    packets(server, 0.0)
    server.receive_datagram(encode_ack(1), 0.1)
    assert packets(server, 0.1) == [Error(0, "file changed during transfer")]


def test_ack_of_final_block_completes_and_silences():
    server = ReadTransfer(reader_for(b"abc"), 3, Options(), 0.0)
    packets(server, 0.0)
    server.receive_datagram(encode_ack(1), 0.2)
    assert server.done and server.get_timer() is None
    assert server.next_event() == TransferComplete(3, 0)
    assert server.next_event() is None
    server.handle_timer(100.0)
    assert server.datagrams_to_send(100.0) == []


def test_ack_zero_in_plain_mode_is_ignored():
    server = ReadTransfer(reader_for(b"abc"), 3, Options(), 0.0)
    packets(server, 0.0)
    server.receive_datagram(encode_ack(0), 0.1)
    assert server.datagrams_to_send(0.1) == [] and not server.done
    assert isinstance(Ack(0), Ack)
