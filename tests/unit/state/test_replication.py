"""The replication stream's two ends, pure: hand-over of the log, divergent tails cut,
snapshots for followers too far behind, and the refusals that fence a deposed leader."""

from __future__ import annotations

import pytest

from appliance.state.records import EpochHistory, Record, encode
from appliance.state.replication import (
    Append,
    FollowerStream,
    Install,
    LeaderStream,
    Truncate,
)
from appliance.state.signing import Refused
from appliance.state.tables import Tables


class MemorySource:
    """A leader's log in memory: a snapshot at ``base`` and the records after it."""

    def __init__(self, records: list[Record], base: int = 0) -> None:
        self.all = records
        self.base = base
        self.tables = Tables()
        for record in records[:base]:
            self.tables.apply(record)
        self.history = EpochHistory()
        for record in records:
            self.history.note(record.epoch, record.lsn)

    def last(self) -> int:
        return self.all[-1].lsn if self.all else 0

    def records(self, after: int, limit: int):
        return self.all[after : after + limit]

    def snapshot(self):
        return self.tables.snapshot()

    def end_of(self, epoch: int):
        end = self.history.end_of(epoch, self.last())
        newest = max((e for e, _ in self.history.entries if e <= epoch), default=epoch)
        return (newest, -1 if end is None else end)

    def epoch_at(self, lsn: int):
        return self.all[lsn - 1].epoch if 0 < lsn <= len(self.all) else None


def log_of(epochs: list[int], ns: str = "leases") -> list[Record]:
    return [Record(e, n + 1, ns, f"k{n}", n) for n, e in enumerate(epochs)]


def run(leader: LeaderStream, follower: FollowerStream, have: list[Record]) -> list[Record]:
    """Drive both ends to quiescence; returns the follower's log."""
    log = list(have)
    reply = leader.receive(follower.hello())
    actions, answer = follower.receive(reply)
    assert answer is None
    apply(log, actions)
    last = log[-1] if log else None
    assert leader.receive(follower.resume(last.epoch if last else 0, len(log))) is None
    while (message := leader.next_message()) is not None:
        actions, back = follower.receive(message)
        assert back is None
        apply(log, actions)
        if actions and isinstance(actions[-1], Append):
            leader.receive(follower.durable(actions[-1].records[-1].lsn))
        elif actions and isinstance(actions[-1], Install):
            leader.receive(follower.durable(actions[-1].head.lsn))  # installed: on its disk
    return log


def apply(log: list[Record], actions) -> None:
    for action in actions:
        if isinstance(action, Truncate):
            del log[action.lsn :]
        elif isinstance(action, Install):
            log[:] = [None] * action.head.lsn  # the snapshot stands for the records before it
        else:
            log.extend(action.records)


def follower_of(log: list[Record], known_epoch: int = 0) -> FollowerStream:
    history = EpochHistory()
    for record in log:
        history.note(record.epoch, record.lsn)
    last = (log[-1].epoch, log[-1].lsn) if log else (0, 0)
    return FollowerStream(last, history, known_epoch)


def test_a_new_follower_receives_the_whole_log_and_acknowledges_it():
    records = log_of([1] * 1500)
    leader = LeaderStream(MemorySource(records), epoch=1)
    assert run(leader, follower_of([]), []) == records
    assert leader.acked == 1500 and leader.streaming


def test_a_follower_behind_continues_from_its_last_record():
    records = log_of([1] * 10 + [2] * 10)
    leader = LeaderStream(MemorySource(records), epoch=2)
    assert run(leader, follower_of(records[:7]), records[:7]) == records


def test_a_divergent_tail_of_a_deposed_leader_is_cut():
    """Records 1-5 of epoch 1 are shared; the follower then wrote 6-8 as the holder of
    epoch 2 and was deposed before anyone else had them; the new leader of epoch 3
    continued epoch 1's log at 6."""
    shared = log_of([1] * 5)
    follower_log = shared + [Record(2, n, "leases", "x", n) for n in (6, 7, 8)]
    leader_log = shared + [Record(1, 6, "leases", "y", 6)] + [Record(3, n, "leases", "z", n)
                                                               for n in range(7, 12)]  # fmt: skip
    leader = LeaderStream(MemorySource(leader_log), epoch=3)
    assert run(leader, follower_of(follower_log), follower_log) == leader_log


def test_a_follower_ahead_within_the_same_epoch_is_cut_to_the_leaders_end():
    records = log_of([1] * 5 + [2] * 5)
    extra = records + [Record(2, 11, "leases", "lost", 0)]  # written by a deposed epoch-2 holder
    leader_log = records + [Record(4, 11, "leases", "new", 1)]
    leader = LeaderStream(MemorySource(leader_log), epoch=4)
    assert run(leader, follower_of(extra), extra) == leader_log


def test_a_follower_too_far_behind_gets_a_snapshot_then_the_records():
    records = log_of([1] * 50 + [2] * 50)
    leader = LeaderStream(MemorySource(records, base=60), epoch=2)
    follower = follower_of(records[:10])
    log = run(leader, follower, records[:10])
    assert log[60:] == records[60:] and len(log) == 100
    assert follower.last_lsn == 100


def test_a_snapshot_is_sent_in_chunks_and_installed_whole():
    records = [Record(1, n + 1, "ns", f"k{n}", n) for n in range(5000)]
    source = MemorySource(records, base=5000)
    leader = LeaderStream(source, epoch=1)
    follower = follower_of([])
    follower.receive(leader.receive(follower.hello()))
    leader.receive(follower.resume(0, 0))
    chunks = []
    while (message := leader.next_message()) is not None:
        chunks.append(follower.receive(message)[0])
    assert [len(c) for c in chunks] == [0, 0, 1]
    install = chunks[-1][0]
    assert isinstance(install, Install) and len(install.entries) == 5000


def test_a_standby_sent_a_snapshot_counts_only_once_it_acknowledged_the_install():
    """Counted when the frames were sent, a standby still installing (or dead before it
    did) could be elected with an empty log."""
    records = log_of([1] * 100)
    leader = LeaderStream(MemorySource(records, base=100), epoch=1)
    follower = follower_of([])
    follower.receive(leader.receive(follower.hello()))
    leader.receive(follower.resume(0, 0))
    while (message := leader.next_message()) is not None:
        actions, _ = follower.receive(message)
    assert leader.streaming and leader.acked == 0  # everything sent, nothing on its disk
    assert isinstance(actions[-1], Install)
    leader.receive(follower.durable(actions[-1].head.lsn))
    assert leader.acked == 100


def test_frames_of_an_older_epoch_are_refused():
    follower = follower_of(log_of([1] * 3), known_epoch=5)
    follower.hello()
    follower.receive(["end", 1, 3])
    follower.resume(1, 3)
    with pytest.raises(Refused) as refused:
        follower.receive(["records", 4, []])
    assert refused.value.reason == "old-epoch"


def test_replays_gaps_and_messages_out_of_turn_are_refused():
    log = log_of([1] * 3)
    follower = follower_of(log)
    with pytest.raises(Refused):
        follower.receive(["records", 1, []])  # before the hand-shake
    follower.hello()
    follower.receive(["end", 1, 3])
    follower.resume(1, 3)
    with pytest.raises(Refused) as replay:
        follower.receive(["records", 1, [encode(Record(1, 3, "ns", "k", 1))]])
    assert replay.value.reason == "replay"
    with pytest.raises(Refused) as gap:
        follower.receive(["records", 1, [encode(Record(1, 5, "ns", "k", 1))]])
    assert gap.value.reason == "gap"
    with pytest.raises(Refused) as garbage:
        follower.receive(["records", 1, [b"\x00garbage"]])
    assert garbage.value.reason == "malformed"


def test_the_leader_refuses_acks_beyond_what_it_sent_and_followers_of_newer_epochs():
    leader = LeaderStream(MemorySource(log_of([1] * 3)), epoch=1)
    with pytest.raises(Refused) as newer:
        leader.receive(["hello", 2, 3])
    assert newer.value.reason == "newer-epoch"
    leader = LeaderStream(MemorySource(log_of([1] * 3)), epoch=1)
    leader.receive(["hello", 1, 1])
    leader.receive(["from", 1, 1])
    leader.next_message()
    with pytest.raises(Refused):
        leader.receive(["ack", 9])


def test_the_leader_estimates_a_followers_clock_skew_from_a_ping():
    records = log_of([1] * 3)
    leader = LeaderStream(MemorySource(records), epoch=1)
    follower = follower_of(records)
    follower.receive(leader.receive(follower.hello()))
    leader.receive(follower.resume(1, 3))
    ping = leader.ping(1000.0)
    # the follower's clock is 20 s ahead; the answer comes back 0.2 s later
    _, pong = follower.receive(ping, wall=1020.1)
    leader.receive(pong, wall=1000.2)
    assert leader.rtt == pytest.approx(0.2) and leader.skew == pytest.approx(20.0)
    leader.receive(["pong", 10.0, 5.0], wall=1000.3)  # no ping of ours: ignored
    assert leader.skew == pytest.approx(20.0)


def test_a_ping_of_an_older_epoch_is_refused_like_its_records():
    follower = follower_of(log_of([1] * 3), known_epoch=4)
    follower.hello()
    follower.receive(["end", 1, 3])
    follower.resume(1, 3)
    with pytest.raises(Refused) as refused:
        follower.receive(["ping", 3, 1.0], wall=1.0)
    assert refused.value.reason == "old-epoch"
