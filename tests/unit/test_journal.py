"""The journal file: framing, torn tails cut at every possible byte, damage in the
middle recovered around at every possible byte (kept aside, logged, reported),
atomic compaction and what each of its failures leaves."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.journal import (
    DAMAGED,
    FRAME,
    CompactionError,
    JournalFile,
    frame,
    scan_untrusted,
    unframe_untrusted,
)
from tests.support.logs import captured_logs

payload_lists = st.lists(st.binary(min_size=1, max_size=64), max_size=20)


@given(payload_lists)
def test_frames_round_trip(payloads):
    data = b"".join(frame(p) for p in payloads)
    assert unframe_untrusted(data) == (payloads, len(data))


@given(payload_lists, st.data())
def test_any_truncation_keeps_exactly_the_whole_frames(payloads, data):
    encoded = b"".join(frame(p) for p in payloads)
    cut = data.draw(st.integers(0, len(encoded)))
    kept, offset = unframe_untrusted(encoded[:cut])
    assert kept == payloads[: len(kept)]
    assert offset == sum(FRAME.size + len(p) for p in kept)
    assert offset <= cut
    if len(kept) < len(payloads):  # the next frame really was incomplete
        assert cut - offset < FRAME.size + len(payloads[len(kept)])


@given(st.lists(st.binary(min_size=1, max_size=32), min_size=2, max_size=8), st.data())
def test_a_flipped_bit_ends_the_good_run(payloads, data):
    encoded = bytearray(b"".join(frame(p) for p in payloads))
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= 1 << data.draw(st.integers(0, 7))
    kept, offset = unframe_untrusted(bytes(encoded))
    # Whatever survives is a prefix of what was written, and ends before the damage.
    assert kept == payloads[: len(kept)]
    assert offset <= position


def test_oversized_length_is_not_trusted():
    data = FRAME.pack(1 << 30, 0) + b"x" * 16
    assert unframe_untrusted(data, max_record=1024) == ([], 0)


def test_open_cuts_a_torn_tail_and_appends_after_it(tmp_path):
    path = tmp_path / "j"
    path.write_bytes(frame(b"one") + frame(b"two") + frame(b"three")[:-2])
    journal = JournalFile(path)
    assert journal.open() == [b"one", b"two"]
    journal.append(frame(b"four"), 1)
    journal.close()
    assert JournalFile(path).open() == [b"one", b"two", b"four"]


def test_new_journal_is_private(tmp_path):
    journal = JournalFile(tmp_path / "new")
    assert journal.open() == []
    journal.close()
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o600


def test_rewrite_replaces_content_atomically(tmp_path):
    path = tmp_path / "j"
    journal = JournalFile(path)
    journal.open()
    for i in range(10):
        journal.append(frame(b"v%d" % i), 1)
    assert journal.records == 10
    journal.rewrite([b"v9"])
    assert journal.records == 1 and not (tmp_path / "j.compact").exists()
    journal.append(frame(b"v10"), 1)
    journal.close()
    assert JournalFile(path).open() == [b"v9", b"v10"]


def test_failed_append_leaves_no_torn_frame(tmp_path, monkeypatch):
    path = tmp_path / "j"
    journal = JournalFile(path)
    journal.open()
    journal.append(frame(b"good"), 1)

    def failing(fd):
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fdatasync", failing)
        with pytest.raises(OSError):
            journal.append(frame(b"lost"), 1)
    journal.append(frame(b"after"), 1)
    journal.close()
    assert JournalFile(path).open() == [b"good", b"after"]


def test_zeroed_bytes_are_not_records():
    # Eight zero bytes were a valid empty frame: a zeroed block read as records.
    with pytest.raises(ValueError):
        frame(b"")
    assert unframe_untrusted(frame(b"a") + bytes(4096)) == ([b"a"], FRAME.size + 1)
    assert scan_untrusted(frame(b"a") + bytes(64) + frame(b"b")).payloads == [b"a", b"b"]


RECORDS = [b"alpha", b"bravo-2", b"c", b"delta delta", b"echo"]
ENCODED = b"".join(frame(r) for r in RECORDS)


def spans(records: list[bytes]) -> list[tuple[int, int]]:
    ends, end = [], 0
    for record in records:
        ends.append((end, end + FRAME.size + len(record)))
        end = ends[-1][1]
    return ends


def expected(records: list[bytes], size: int, flip: int | None) -> tuple[list[bytes], int | None]:
    """What a journal of ``records`` cut to ``size`` bytes, its byte at ``flip``
    damaged, must give back: every whole record but the damaged one, and that
    one's index if it is damage in the middle (a whole record follows it)."""
    whole = [i for i, (_, end) in enumerate(spans(records)) if end <= size]
    hit = next(
        (i for i, (s, e) in enumerate(spans(records)) if flip is not None and s <= flip < e), None
    )
    kept = [i for i in whole if i != hit]
    middle = hit if hit is not None and any(i > hit for i in kept) else None
    return [records[i] for i in kept], middle


def check_scan(records: list[bytes], size: int, flip: int | None, mask: int) -> None:
    data = bytearray(b"".join(frame(r) for r in records)[:size])
    if flip is not None:
        data[flip] ^= mask
    scan = scan_untrusted(bytes(data))
    kept, middle = expected(records, size, flip)
    where = f"size={size} flip={flip} mask={mask:#x}"
    assert scan.payloads == kept, where  # nothing lost around the damage, nothing invented
    assert bool(scan.skipped) == (middle is not None), where
    assert scan.bytes_lost == size - sum(FRAME.size + len(r) for r in kept), where
    if middle is not None:
        start, length = scan.skipped[0]
        assert start <= flip < start + length, where
        assert scan.recovered == len(kept) - middle, where


@pytest.mark.parametrize("mask", [1 << bit for bit in range(8)] + [0xFF])
def test_every_cut_and_every_damaged_byte_keeps_every_other_record(mask):
    for size in range(len(ENCODED) + 1):
        for flip in [None, *range(size)]:
            check_scan(RECORDS, size, flip, mask)


@given(
    st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=12),
    st.integers(1, 255),
    st.data(),
)
def test_damage_anywhere_in_any_journal_keeps_every_other_record(records, mask, data):
    total = sum(FRAME.size + len(r) for r in records)
    size = data.draw(st.integers(1, total))
    check_scan(records, size, data.draw(st.integers(0, size - 1)), mask)


def damaged_journal(tmp_path: Path, flip: int) -> tuple[Path, bytes]:
    data = bytearray(ENCODED)
    data[flip] ^= 0xFF
    path = tmp_path / "j"
    path.write_bytes(data)
    return path, bytes(data)


def test_open_recovers_around_damage_at_every_offset(tmp_path):
    for flip in range(len(ENCODED)):
        folder = tmp_path / str(flip)
        folder.mkdir()
        path, data = damaged_journal(folder, flip)
        records, middle = expected(RECORDS, len(ENCODED), flip)
        journal = JournalFile(path)
        assert journal.open() == records, flip
        journal.append(frame(b"after"), 1)
        journal.close()
        copies = sorted(folder.glob("j" + DAMAGED + "*"))
        if middle is not None:  # kept aside, then the journal rewritten clean
            (report,) = journal.damage
            assert copies == [Path(report["copy"])] and copies[0].read_bytes() == data, flip
            assert stat.S_IMODE(copies[0].stat().st_mode) == 0o600
            assert path.read_bytes() == b"".join(frame(r) for r in [*records, b"after"]), flip
        else:  # a torn tail: cut off, nothing to report
            assert journal.damage == [] and copies == [], flip
        reopened = JournalFile(path)
        assert reopened.open() == [*records, b"after"], flip
        reopened.close()


SECOND = spans(RECORDS)[1]


def test_damage_is_logged_as_an_error_naming_the_file_the_offsets_and_the_copy(tmp_path):
    path, data = damaged_journal(tmp_path, SECOND[0] + FRAME.size + 2)  # a payload byte
    journal = JournalFile(path)
    with captured_logs() as lines:
        assert journal.open() == [r for r in RECORDS if r != b"bravo-2"]
    journal.close()
    (line,) = [line for line in lines() if line["level"] == "error"]
    assert line["logger"] == "rackboot.journal" and "damaged in the middle" in line["msg"]
    assert line["file"] == str(path)
    assert line["damaged_at"] == [[SECOND[0], SECOND[1] - SECOND[0]]]
    assert (line["bytes_lost"], line["records_kept"], line["records_recovered"]) == (
        SECOND[1] - SECOND[0], 4, 3,
    )  # fmt: skip
    assert line["copy"] == journal.damage[0]["copy"] and Path(line["copy"]).read_bytes() == data


def test_the_report_stays_at_every_start_until_the_copy_is_removed(tmp_path):
    path, _ = damaged_journal(tmp_path, SECOND[0])
    first = JournalFile(path)
    first.open()
    first.close()
    (report,) = first.damage
    again = JournalFile(path)
    with captured_logs() as lines:
        assert again.open() == [r for r in RECORDS if r != b"bravo-2"]
    again.close()
    # The copy is scanned again: the same report (its time is the copy's).
    assert [{**r, "when": None} for r in again.damage] == [{**report, "when": None}]
    (line,) = [line for line in lines() if line["level"] == "warning"]
    assert "earlier start" in line["msg"] and line["copy"] == report["copy"]
    os.unlink(report["copy"])
    cleared = JournalFile(path)
    cleared.open()
    cleared.close()
    assert cleared.damage == []


def test_a_copy_never_overwrites_an_earlier_one(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    earlier = tmp_path / ("j" + DAMAGED + "20231114T221320Z")
    earlier.write_bytes(b"earlier")
    path, data = damaged_journal(tmp_path, 0)
    journal = JournalFile(path)
    journal.open()
    journal.close()
    assert earlier.read_bytes() == b"earlier"
    assert journal.damage[-1]["copy"] == str(earlier) + "-1"
    assert Path(journal.damage[-1]["copy"]).read_bytes() == data
    assert journal.damage[-1]["when"] == "2023-11-14T22:13:20Z"


@pytest.mark.parametrize("fails", ["copy", "rewrite"])
def test_if_copy_or_rewrite_fails_the_journal_is_left_as_it_is_and_recovered_again(
    tmp_path, monkeypatch, fails
):
    path, data = damaged_journal(tmp_path, SECOND[0])
    real_open = os.open
    marker = DAMAGED if fails == "copy" else ".compact"

    def failing(name, *args, **kwargs):
        if marker in os.fspath(name):
            raise OSError(28, "No space left on device")
        return real_open(name, *args, **kwargs)

    records = [r for r in RECORDS if r != b"bravo-2"]
    with monkeypatch.context() as patch:
        patch.setattr(os, "open", failing)
        journal = JournalFile(path)
        assert journal.open() == records
        (report,) = journal.damage
        assert report["records_recovered"] == 3 and (report["copy"] is None) == (fails == "copy")
        journal.append(frame(b"after"), 1)
        journal.close()
    assert path.read_bytes() == data + frame(b"after")  # the evidence is still there
    again = JournalFile(path)
    assert again.open() == [*records, b"after"]
    again.close()
    assert Path(again.damage[-1]["copy"]).read_bytes() == data + frame(b"after")
    assert path.read_bytes() == b"".join(frame(r) for r in [*records, b"after"])


def is_directory(fd: int) -> bool:
    return stat.S_ISDIR(os.fstat(fd).st_mode)


STEPS = {  # os function, when it fails, whether the new file is then the journal
    "create": ("open", lambda name, *_: os.fspath(name).endswith(".compact"), False),
    "write": ("write", lambda *_: True, False),
    "fsync": ("fsync", lambda fd: not is_directory(fd), False),
    "rename": ("replace", lambda *_: True, False),
    "open directory": ("open", lambda name, flags, *_: bool(flags & os.O_DIRECTORY), True),
    "fsync directory": ("fsync", is_directory, True),
}


def journal_of_four(path: Path) -> JournalFile:
    journal = JournalFile(path)
    journal.open()
    for i in range(4):
        journal.append(frame(b"v%d" % i), 1)
    return journal


def inject(patch, call: str, fails) -> None:
    real = getattr(os, call)

    def injected(*args, **kwargs):
        if fails(*args):
            raise OSError(5, "Input/output error")
        return real(*args, **kwargs)

    patch.setattr(os, call, injected)


@pytest.mark.parametrize("step", STEPS)
def test_each_failed_compaction_step_says_which_file_is_the_journal(tmp_path, monkeypatch, step):
    call, fails, replaced = STEPS[step]
    path = tmp_path / "j"
    journal = journal_of_four(path)
    with monkeypatch.context() as patch:
        inject(patch, call, fails)
        with pytest.raises(CompactionError) as caught:
            journal.rewrite([b"v3"])
        assert caught.value.replaced is replaced
        assert journal.records == (1 if replaced else 4)
        if replaced:  # in place, but no append is acknowledged until the rename is durable
            with pytest.raises(OSError):
                journal.append(frame(b"lost"), 1)
    journal.append(frame(b"after"), 1)  # the directory fsync is retried first
    journal.close()
    before = [b"v3"] if replaced else [b"v0", b"v1", b"v2", b"v3"]
    assert JournalFile(path).open() == [*before, b"after"]
    assert not (tmp_path / "j.compact").exists()


def test_records_appended_after_a_failed_directory_fsync_are_not_lost(tmp_path, monkeypatch):
    # The journal used to keep appending to the old file, already unlinked by the rename.
    path = tmp_path / "j"
    journal = journal_of_four(path)
    with monkeypatch.context() as patch:
        inject(patch, "fsync", is_directory)
        with pytest.raises(OSError):
            journal.rewrite([b"v3"])
    journal.append(frame(b"after"), 1)
    journal.close()
    assert JournalFile(path).open() == [b"v3", b"after"]


def test_compaction_does_not_reopen_the_journal(tmp_path, monkeypatch):
    # A reopen after the rename could fail and leave no journal to append to.
    path = tmp_path / "j"
    journal = journal_of_four(path)
    with monkeypatch.context() as patch:
        inject(patch, "open", lambda name, *_: os.fspath(name) == os.fspath(path))
        journal.rewrite([b"v3"])
        journal.append(frame(b"after"), 1)
    journal.close()
    assert JournalFile(path).open() == [b"v3", b"after"]
