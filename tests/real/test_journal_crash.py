"""kill -9 a process in the middle of group-committed appends: nothing acknowledged is lost.

A child process appends numbered records as fast as it can and prints each
number once its batch is durable. The test kills it with SIGKILL at a varying
moment, reopens the journal and checks that the records are exactly 0..n in
order (no gap, no garbage), that every acknowledged number is among them, and
that the torn tail is not mistaken for damage.
No root needed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from appliance.journal import JournalFile

WRITER = textwrap.dedent(
    """
    import sys, trio
    from appliance.journal import GroupCommitter, JournalFile

    async def main(path):
        journal = JournalFile(path)
        journal.open()
        committer = GroupCommitter(journal)
        out = sys.stdout
        async with trio.open_nursery() as nursery:
            await nursery.start(committer.run)
            for seq in range(10_000_000):
                committer.submit(b"%d" % seq, lambda seq=seq: out.write(f"{seq}\\n") or out.flush())
                if seq % 64 == 63:
                    await trio.sleep(0)

    trio.run(main, sys.argv[1])
    """
)


@pytest.mark.parametrize("kill_after_acks", [1, 37, 500, 2000, 5000])
def test_sigkill_loses_no_acknowledged_record(tmp_path, kill_after_acks):
    path = tmp_path / "journal"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    acked = -1
    deadline = time.monotonic() + 60
    try:
        assert child.stdout is not None
        for line in child.stdout:
            acked = int(line)
            if acked >= kill_after_acks or time.monotonic() > deadline:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert acked >= kill_after_acks, "the writer did not get far enough"
    journal = JournalFile(path)
    records = journal.open()
    journal.close()
    assert records == [b"%d" % i for i in range(len(records))]
    assert len(records) > acked
    # A crash leaves at most a torn tail, never damage in the middle: no alarm, no copy.
    assert journal.damage == [] and not list(tmp_path.glob("journal.damaged-*"))
