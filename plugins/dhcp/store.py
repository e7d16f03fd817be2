"""The durable lease store: every lease change is a journal record, fsynced
(group commit) before the client hears of it.

This is the seam the replicated log will take over (Step 7): the server only
calls :meth:`LeaseStore.commit` and waits for ``on_durable``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from appliance.journal import GroupCommitter, JournalFile
from appliance.logs import get_logger

from .leases import (
    MAX_RECORD_BYTES,
    CorruptRecord,
    Lease,
    LeaseTable,
    decode_lease_untrusted,
    encode_lease,
)

log = get_logger("dhcp.store")

COMPACT_MIN_RECORDS = 4096  # below this the journal is never compacted
COMPACT_RATIO = 4  # compact when it holds this many records per live one


class LeaseStore:
    def __init__(self, path: Path) -> None:
        self.journal = JournalFile(path, max_record=MAX_RECORD_BYTES + 64)
        self.committer = GroupCommitter(self.journal)
        self.table = LeaseTable()
        self.corrupt = 0

    def load(self) -> LeaseTable:
        """Replay the journal (a torn tail from a crash is cut off, damage recovered around)."""
        for payload in self.journal.open():
            try:
                self.table.apply(decode_lease_untrusted(payload))
            except CorruptRecord as exc:
                self.corrupt += 1
                log.error(
                    "skipping unreadable lease record", path=str(self.journal.path), error=str(exc)
                )
        log.info(
            "leases loaded",
            path=str(self.journal.path),
            records=self.journal.records,
            leases=len(self.table),
        )
        return self.table

    def commit(
        self, leases: Sequence[Lease], on_durable: Callable[[], object] | None = None
    ) -> None:
        """Make ``leases`` durable, then call ``on_durable`` (in the trio thread)."""
        last = len(leases) - 1
        for i, lease in enumerate(leases):
            self.committer.submit(encode_lease(lease), on_durable if i == last else None)
        if self.journal.records + self.committer.pending > max(
            COMPACT_MIN_RECORDS, COMPACT_RATIO * len(self.table)
        ):
            self.committer.request_rewrite(self._snapshot)

    def _snapshot(self) -> list[bytes]:
        return [encode_lease(lease) for lease in self.table]

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self.committer.run(task_status=task_status)
        finally:
            self.journal.close()
