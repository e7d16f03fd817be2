"""The journal file: framing, torn tails cut at every possible byte, atomic compaction."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.journal import FRAME, JournalFile, frame, unframe_untrusted

payload_lists = st.lists(st.binary(max_size=64), max_size=20)


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
