"""When the relay reads its socket (plugins/relay/service.py, ``RelayService._serve``), on
trio's autojump clock: the first datagram after a quiet spell at once; while more come,
all that came during each GATHER_SECONDS in one read (a wake-up costs more CPU than
relaying a datagram); back to waiting for the socket once a read found nothing, so a
quiet relay is never woken. The socket is a real one (trio waits on it); the reads are
recorded instead of relayed."""

from __future__ import annotations

import socket

import pytest
import trio

from plugins.relay import service
from plugins.relay.service import RelayService

GATHER = service.GATHER_SECONDS


async def test_the_first_datagram_at_once_then_what_came_every_gather(autojump_clock):
    relay = RelayService(lambda: None, 67, 68)  # type: ignore[arg-type, return-value]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.setblocking(False)
    reads: list[tuple[float, int]] = []  # when, how many

    def drain(agent, sock: socket.socket, budget: int) -> int:
        count = 0
        while count < budget:
            try:
                sock.recv(64)
            except BlockingIOError:
                break
            count += 1
        reads.append((trio.current_time(), count))
        return count

    relay._drain = drain  # type: ignore[method-assign]
    with ours, theirs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(relay._serve, None, ours)
            await trio.sleep(1.0)
            assert reads == []  # nothing came: never woken
            theirs.send(b"1")  # at t = 1: relayed at once
            await trio.sleep(GATHER * 0.25)
            theirs.send(b"2")
            theirs.send(b"3")
            await trio.sleep(GATHER * 0.5)
            theirs.send(b"4")  # 2, 3 and 4: gathered into one read at 1 + GATHER
            await trio.sleep(GATHER * 1.0)
            theirs.send(b"5")  # read at 1 + 2 GATHER; the next read finds nothing
            await trio.sleep(10.0)
            assert len(reads) == 4  # and nothing more while quiet
            theirs.send(b"6")  # after a quiet spell: at once again
            await trio.sleep(GATHER * 0.1)
            nursery.cancel_scope.cancel()
    start = 1.0
    expected = [(start, 1), (start + GATHER, 3), (start + 2 * GATHER, 1),
                (start + 3 * GATHER, 0), (start + 1.75 * GATHER + 10.0, 1)]  # fmt: skip
    assert [count for _, count in reads] == [count for _, count in expected]
    assert [when for when, _ in reads] == pytest.approx([when for when, _ in expected])
