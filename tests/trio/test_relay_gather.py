"""When the relay reads its socket (plugins/relay/service.py, ``RelayService._serve``), on
trio's autojump clock: each datagram as it comes while few come; once BUSY_DATAGRAMS came
within GATHER_SECONDS, all that came every GATHER_SECONDS (a wake-up costs more CPU
than relaying a datagram), until fewer come; never a read while nothing comes. The
socket is a real one (trio waits on it); the reads are recorded instead of relayed."""

from __future__ import annotations

import socket

import pytest
import trio

from plugins.relay import service
from plugins.relay.service import RelayService

G = service.GATHER_SECONDS
START = 1.0
# (when, datagrams sent then): datagrams 1-3 within one window, 4-6 during the first
# gathering wait, 7 alone during the second; then three far apart.
SENT = [(0.0, 1), (0.4, 1), (0.8, 1), (1.0, 1), (1.2, 1), (1.4, 1), (2.0, 1), (5.0, 1),
        (7.0, 1), (9.0, 1)]  # fmt: skip
READS = [
    (0.0, 1), (0.4, 1), (0.8, 1),  # as they come, until the third within G: busy
    (1.8, 3),  # gathered G after the third
    (2.8, 1),  # only one came: as they come again
    (5.0, 1), (7.0, 1), (9.0, 1),  # more than G apart: never three in a window
]  # fmt: skip


async def test_as_they_come_while_few_gathered_while_busy(autojump_clock):
    assert service.BUSY_DATAGRAMS == 3  # the schedule below is made for it
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
            await trio.sleep_until(START)
            assert reads == []  # nothing came: never woken
            for when, count in SENT:
                await trio.sleep_until(START + when * G)
                for _ in range(count):
                    theirs.send(b"x")
            await trio.sleep(10.0)
            nursery.cancel_scope.cancel()
    assert [count for _, count in reads] == [count for _, count in READS]
    assert [when for when, _ in reads] == pytest.approx([START + w * G for w, _ in READS])
