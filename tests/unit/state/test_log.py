"""Reading the state log back: every truncation and every corrupted byte of a log gives
either its exact state after some prefix of records, with any loss reported, never a
wrong state and never an exception."""

from __future__ import annotations

import copy

from appliance.frames import frame, scan_untrusted
from appliance.state.log import read_entries, snapshot_payloads
from appliance.state.records import MAX_ENTRY, Record, encode
from appliance.state.tables import Tables


def history() -> tuple[Tables, list[Record]]:
    """A snapshot after 6 records, then 14 more across two epochs."""
    records = [
        Record(1 if n < 10 else 3, n, "leases" if n % 3 else "events", f"k{n % 5}",
               None if n % 7 == 0 else {"n": n, "b": bytes([n]) * 8})
        for n in range(1, 21)
    ]  # fmt: skip
    base = Tables()
    for record in records[:6]:
        base.apply(record)
    return base, records


def states(base: Tables, records: list[Record]) -> dict[int, dict]:
    """The tables' content after each LSN from the snapshot on."""
    tables, out = copy.deepcopy(base), {base.lsn: copy.deepcopy(base.data)}
    for record in records[base.lsn :]:
        tables.apply(record)
        out[record.lsn] = copy.deepcopy(tables.data)
    return out


def log_bytes(base: Tables, records: list[Record]) -> tuple[bytes, list[int]]:
    """The file, and the offset where each record after the snapshot ends."""
    data, ends = bytearray(), []
    for payload in snapshot_payloads(base, []):
        data += frame(payload)
    for record in records[base.lsn :]:
        data += frame(encode(record))
        ends.append(len(data))
    return bytes(data), ends


def read(data: bytes):
    return read_entries(scan_untrusted(data, MAX_ENTRY).payloads)


def test_a_clean_log_reads_back_whole():
    base, records = history()
    data, _ = log_bytes(base, records)
    recovery = read(data)
    assert recovery.problem == "" and recovery.base == 6 and recovery.tables.lsn == 20
    assert recovery.tables.data == states(base, records)[20]
    assert recovery.tables.history.entries == [(1, 1), (3, 10)]


def test_every_truncation_keeps_exactly_the_whole_records_before_it():
    base, records = history()
    data, ends = log_bytes(base, records)
    expected = states(base, records)
    head_end = len(frame(snapshot_payloads(base, [])[0]))
    snapshot_end = ends[0] - len(frame(encode(records[6])))
    for cut in range(len(data) + 1):
        recovery = read(data[:cut])
        if cut < snapshot_end:
            # a torn snapshot is never read as a state (compaction writes it whole, by rename)
            assert recovery.tables.lsn == 0 and recovery.tables.data == {}, cut
            assert bool(recovery.problem) == (cut >= head_end), cut
            continue
        whole = 6 + sum(1 for end in ends if end <= cut)
        assert recovery.tables.lsn == whole, cut
        assert recovery.tables.data == expected[whole], cut
        assert recovery.problem == "" and not recovery.beyond, cut


def test_every_corrupted_byte_is_noticed_or_harmless():
    base, records = history()
    data, ends = log_bytes(base, records)
    expected = states(base, records)
    for offset in range(len(data)):
        for flip in (0x01, 0xFF):
            damaged = bytearray(data)
            damaged[offset] ^= flip
            recovery = read(bytes(damaged))
            lsn = recovery.tables.lsn
            # whatever was applied is the true state after some prefix of the history...
            assert lsn in expected or lsn == 0, (offset, flip)
            if lsn:
                assert recovery.tables.data == expected[lsn], (offset, flip)
            # ...and anything short of the whole log is said, with what lies beyond it
            if lsn < 20:
                assert recovery.problem or lsn == 0 and offset == len(data) - 1 or (
                    offset >= len(data) - (ends[-1] - ends[-2]) and lsn == 19
                ), (offset, flip, lsn)
            assert all(r in records for r in recovery.beyond), (offset, flip)


def test_a_damaged_record_in_the_middle_leaves_the_later_ones_beyond():
    base, records = history()
    data, ends = log_bytes(base, records)
    damaged = bytearray(data)
    damaged[ends[5] + 10] ^= 0xFF  # inside record 13 (the 7th after the snapshot)
    recovery = read(bytes(damaged))
    assert recovery.tables.lsn == 12
    assert "after LSN 12" in recovery.problem
    assert [r.lsn for r in recovery.beyond] == list(range(14, 21))
