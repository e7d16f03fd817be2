"""Backups of the state log (``rackboot state backup|restore``, docs/operations.md).

A backup is a state log file holding one snapshot: the committed tables at one
position, with the epoch history, in the log's own frames. So it is read back by the
log's reader, with its checks (``read_entries``), and a restore is only putting it
where the log goes.

* **backup** from a running node: the control command ``state.backup`` takes the
  snapshot in the node's trio thread (one position, committed records only) and writes
  the file atomically, mode 0600. With no node answering, the CLI reads the log on disk
  under the node's lock instead (what a restart would read).
* **restore** with the node stopped (its lock held): the backup is checked, the current
  log is kept aside as ``log.before-restore-TIME``, the backup is renamed into place
  (fsynced), and the election's remembered epoch (``ha/state.json``) is raised to the
  backup's: every holder from then on writes under a higher epoch than any record of
  the restored log, which the store requires.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from appliance.cluster.files import PRIVATE, write_atomically
from appliance.control import ControlRequestError
from appliance.errors import AlreadyRunning, RackbootError
from appliance.frames import scan_untrusted
from appliance.journal import frame
from appliance.state.log import Recovery, read_entries, snapshot_payloads
from appliance.state.records import MAX_ENTRY
from appliance.state.tables import Tables

MAX_BACKUP = 4 << 30  # bytes: a larger file is no backup of ours (the log lives in memory)
ASIDE = "log.before-restore-{stamp}"


class BadBackup(RackbootError):
    """A file that is not a whole backup (or log) of the state."""


def snapshot_bytes(tables: Tables) -> bytes:
    """The tables as a log file: a snapshot head, then its entries, each in a frame."""
    return b"".join(frame(payload) for payload in snapshot_payloads(tables, []))


def summary(tables: Tables, path: Path, size: int) -> dict[str, Any]:
    namespaces = Counter(ns for ns, table in tables.data.items() for _ in table)
    return {"path": str(path), "epoch": tables.epoch, "lsn": tables.lsn, "bytes": size,
            "keys": tables.count(), "namespaces": dict(sorted(namespaces.items()))}  # fmt: skip


def write_backup(tables: Tables, path: Path) -> dict[str, Any]:
    data = snapshot_bytes(tables)
    write_atomically(path, data, PRIVATE)
    return summary(tables, path, len(data))


def read_backup_untrusted(path: Path) -> Recovery:
    """The tables a backup (or a copied log) holds; :class:`BadBackup` unless whole."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BACKUP + 1)
    except OSError as exc:
        raise BadBackup(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_BACKUP:
        raise BadBackup(f"{path}: larger than {MAX_BACKUP} bytes: not a backup of the state")
    scan = scan_untrusted(data, MAX_ENTRY)
    if scan.bytes_lost:
        raise BadBackup(f"{path}: damaged or cut short (its frames do not check): not restored")
    if not scan.payloads:
        raise BadBackup(f"{path}: empty: not a backup of the state")
    recovery = read_entries(scan.payloads)
    if recovery.problem:
        raise BadBackup(f"{path}: {recovery.problem}: not restored")
    return recovery


@contextlib.contextmanager
def node_stopped(data_dir: Path, doing: str) -> Iterator[None]:
    """Hold the node's lock: no node runs on ``data_dir`` meanwhile (exit 5 otherwise)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(data_dir / "node.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(
                f"a node runs on {data_dir}: stop it before {doing} (systemctl stop rackboot)"
            ) from None
        yield
    finally:
        os.close(fd)


def backup_offline(data_dir: Path, dest: Path) -> dict[str, Any]:
    """No node answers: the log on disk, as a restart would read it."""
    log = data_dir / "state" / "log"
    with node_stopped(data_dir, "reading its log"):
        if not log.exists():
            raise RackbootError(f"no state log at {log}: nothing to back up")
        recovery = read_backup_untrusted(log)
    return write_backup(recovery.tables, dest)


def restore(data_dir: Path, source: Path, now: float) -> dict[str, Any]:
    """Install ``source`` as the node's state log (the node stopped)."""
    from appliance.ha.service import read_durable, write_durable

    tables = read_backup_untrusted(source).tables
    state = data_dir / "state"
    with node_stopped(data_dir, "restoring its state"):
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = state / "log"
        aside = None
        if log.exists():
            aside = state / ASIDE.format(stamp=time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)))
            os.replace(log, aside)
        result = write_backup(tables, log)
        (state / "log.resync").unlink(missing_ok=True)  # the new log has no hole to refill
        election = data_dir / "ha"
        durable = read_durable(election)
        if durable.epoch < tables.epoch:
            election.mkdir(mode=0o700, exist_ok=True)
            write_durable(election, dataclasses.replace(durable, epoch=tables.epoch))
    result.update(source=str(source), kept_aside=str(aside) if aside else None)
    return result


def control_commands(node: Any) -> dict[str, Any]:
    """``state.backup``: the running node writes a snapshot of its committed tables."""

    async def backup(args: dict[str, Any]) -> dict[str, Any]:
        import trio

        path = args.get("path")
        if not isinstance(path, str) or not os.path.isabs(path) or len(path) > 4096:
            raise ControlRequestError("state.backup needs 'path': an absolute file path")
        tables = Tables()  # one position: the committed tables now, before any await
        head, entries = node.state.tables.snapshot()
        tables.restore(head, entries)
        try:
            return await trio.to_thread.run_sync(write_backup, tables, Path(path))
        except OSError as exc:
            raise ControlRequestError(f"cannot write {path}: {exc.strerror}") from None

    return {"state.backup": backup}
