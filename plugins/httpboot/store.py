"""What the plugin keeps on disk: the events journal and the token secret.

Every event is a journal record, fsynced (group commit) before the installer
hears it was recorded; the journal is replayed at start and compacted when it
holds many times more records than are retained. The same seam as the DHCP
lease store, for replication to take over.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

import trio

from appliance.errors import RackbootError
from appliance.journal import GroupCommitter, JournalFile
from appliance.logs import get_logger

from .events import (
    MAX_RECORD_BYTES,
    Cleared,
    CorruptRecord,
    Event,
    MachineEvents,
    decode_record_untrusted,
    encode_record,
)

log = get_logger("httpboot.store")

COMPACT_MIN_RECORDS = 4096
COMPACT_RATIO = 4
SECRET_BYTES = 32


class EventStore:
    def __init__(self, path: Path, retain: int) -> None:
        self.journal = JournalFile(path, max_record=MAX_RECORD_BYTES + 64)
        self.committer = GroupCommitter(self.journal)
        self.table = MachineEvents(retain)
        self.corrupt = 0

    def load(self) -> MachineEvents:
        """Replay the journal (a torn tail from a crash is cut off, damage recovered around). Blocking."""
        for payload in self.journal.open():
            try:
                self.table.apply(decode_record_untrusted(payload))
            except CorruptRecord as exc:
                self.corrupt += 1
                log.error("skipping unreadable event record", error=str(exc))
        log.info("events loaded", records=self.journal.records, machines=len(self.table))
        return self.table

    def commit(self, record: Event | Cleared, on_durable: Callable[[], object]) -> None:
        """Make ``record`` durable, apply it to the table, then call ``on_durable``."""

        def durable() -> None:
            self.table.apply(record)
            on_durable()

        self.committer.submit(encode_record(record), durable)
        live = self.table.retained + len(self.table)  # at most one Cleared per machine
        if self.journal.records + self.committer.pending > max(
            COMPACT_MIN_RECORDS, COMPACT_RATIO * live
        ):
            self.committer.request_rewrite(self._snapshot)

    def _snapshot(self) -> list[bytes]:
        return [encode_record(record) for record in self.table.records()]

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self.committer.run(task_status=task_status)
        finally:
            self.journal.close()


def load_secret(path: Path) -> bytes:
    """The node's token secret, created (random, mode 0600) if missing. Blocking.

    A secret others may read would let them forge every machine's token: such
    a file is refused, not silently used.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        pass
    else:
        try:
            os.write(fd, secrets.token_bytes(SECRET_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        log.info("created the events token secret", path=str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise RackbootError(
                f"{path}: the events token secret must be a regular file of mode 0600 "
                f"(found {stat.filemode(st.st_mode)})"
            )
        secret = os.read(fd, 4096)
    finally:
        os.close(fd)
    if len(secret) < 16:
        raise RackbootError(f"{path}: the events token secret must hold at least 16 bytes")
    return secret
