"""Leases in the node's replicated state log (docs/state.md, docs/dhcp.md "Storage").

The DHCP plugin's adapter to ``node.state``:

* :meth:`LeaseStore.commit` appends one record per lease (namespace
  :data:`~plugins.dhcp.leases.NAMESPACE`, key the address, value
  :func:`~plugins.dhcp.leases.lease_value`) and calls ``on_durable`` once the
  last one **committed**: durable here and acknowledged by the standbys the
  commit rule asks for. If the rack's lease is lost first, it is never called
  (``on_abandoned`` is); a node that may not write gets :class:`NotWriter` and
  nothing more is appended. The server's view is told as each record commits
  or is abandoned, so its pending overlay empties;
* :meth:`LeaseStore.follow` keeps the committed :class:`LeaseTable` the
  server reads up to date from the state's changefeed, on the active and the
  standby alike (a standby that takes over already has every committed
  lease); a ``Reset`` rebuilds it;
* :meth:`LeaseStore.follow_servers` reads the server identifiers each
  appliance of the rack announced (namespace :data:`SERVERS`), for the server
  to recognise a REQUEST naming another appliance of the rack;
* the journal of earlier releases (``<data_dir>/dhcp/leases.journal``) is read at
  start and imported once this node may write (:meth:`LeaseStore.import_legacy`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import trio

from appliance.journal import JournalFile
from appliance.logs import get_logger
from appliance.state.store import Change, NotWriter, Position, Reset

from .leases import (
    MAX_RECORD_BYTES,
    NAMESPACE,
    CorruptRecord,
    Lease,
    LeaseState,
    LeaseTable,
    LeaseView,
    address_of,
    address_text,
    decode_lease_untrusted,
    lease_from_state_untrusted,
    lease_value,
)

log = get_logger("dhcp.store")

SERVERS = "dhcp.servers"  # node name -> the server identifiers it answers with, as text
IMPORTED = ".imported"  # the old journal, once imported, is renamed with this suffix

__all__ = ["SERVERS", "LeaseStore", "NotWriter"]


class LeaseStore:
    def __init__(self, state: Any, view: LeaseView, *, legacy: Path | None = None) -> None:
        """``state``: the node's StateStore; ``view``: the server's (its table is fed here);
        ``legacy``: where the journal of earlier releases would be."""
        self.state = state
        self.view = view
        self.table: LeaseTable = view.table
        self.legacy_path = legacy
        self.legacy: list[Lease] | None = None  # read at start, until imported
        self.legacy_report: dict[str, Any] = {}
        self._importing = False
        # This node's own committed leases by LSN, until the changefeed applies them: the
        # feed then takes the Lease object itself rather than decode the value again.
        self._own: dict[int, Lease] = {}
        self.counters = {"appended": 0, "committed": 0, "abandoned": 0, "corrupt": 0,
                         "resets": 0}  # fmt: skip

    # -- writing ------------------------------------------------------------------------

    def commit(
        self,
        leases: Sequence[Lease],
        on_durable: Callable[[], object] | None = None,
        on_abandoned: Callable[[], object] | None = None,
    ) -> None:
        """Append ``leases`` (already pending in the view) in order; ``on_durable()`` once the
        last one committed, or ``on_abandoned()`` if the lease was lost first. Raises
        :class:`NotWriter` when this node may not write: the leases not appended are
        abandoned at once (those appended before it are told by their callbacks)."""
        view, counters, append, own = self.view, self.counters, self.state.append, self._own
        last = len(leases) - 1
        for i, lease in enumerate(leases):

            def committed(position: Position | None, lease: Lease = lease, final: bool = i == last):
                if position is None:
                    view.abandon(lease)
                    counters["abandoned"] += 1
                    if final and on_abandoned is not None:
                        _guarded(on_abandoned)
                    return
                own[position.lsn] = lease
                view.committed(lease, position.lsn)
                counters["committed"] += 1
                if final and on_durable is not None:
                    _guarded(on_durable)

            try:
                append(NAMESPACE, address_text(lease.address), lease_value(lease), committed)
            except BaseException:
                for rest in leases[i:]:
                    view.abandon(rest)
                counters["abandoned"] += len(leases) - i
                raise
            counters["appended"] += 1

    # -- reading: the changefeed ------------------------------------------------------------

    def load(self) -> None:
        """Bring the table to the state's committed leases now (before serving)."""
        position = self.state.position
        self._reset(dict(self.state.scan(NAMESPACE)), position)

    async def follow(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Load, then apply every committed change of the namespace as it commits."""
        self.load()
        task_status.started()
        table, view, own = self.table, self.view, self._own
        after = Position(table.epoch, table.lsn)
        async with aclosing(self._subscribe(NAMESPACE, after)) as changes:
            async for change in changes:
                if isinstance(change, Reset):
                    self.counters["resets"] += 1
                    log.info("lease table rebuilt from the state log", lsn=change.position.lsn,
                             leases=len(change.items))  # fmt: skip
                    self._reset(change.items, change.position)
                    continue
                try:
                    if change.value is None:
                        table.remove(address_of(change.key))
                    else:
                        lease = own.pop(change.position.lsn, None)
                        table.apply(
                            lease if lease is not None
                            else lease_from_state_untrusted(change.key, change.value)
                        )  # fmt: skip
                except CorruptRecord as exc:
                    self.counters["corrupt"] += 1
                    log.error("skipping an unreadable lease record", key=change.key[:32],
                              lsn=change.position.lsn, error=str(exc))  # fmt: skip
                table.epoch, table.lsn = change.position.epoch, change.position.lsn
                view.caught_up()

    def _subscribe(self, ns: str, after: Position) -> AsyncGenerator[Change | Reset, None]:
        return self.state.subscribe(ns, after)

    def _reset(self, items: dict[str, Any], position: Position) -> None:
        leases = []
        for key, value in items.items():
            try:
                leases.append(lease_from_state_untrusted(key, value))
            except CorruptRecord as exc:
                self.counters["corrupt"] += 1
                log.error("skipping an unreadable lease record", key=key[:32], error=str(exc))
        # Applied in about the order they were written, so each client points at its latest
        # record (every release is a record of its own: nothing else depends on the order).
        leases.sort(key=_written)
        self.table.reset(leases)
        self.table.epoch, self.table.lsn = position.epoch, position.lsn
        for lsn in [lsn for lsn in self._own if lsn <= position.lsn]:
            del self._own[lsn]
        self.view.caught_up()

    async def follow_servers(self, on_change: Callable[[dict[str, Any]], object]) -> None:
        """``on_change(every appliance's announced identifiers)`` now and at each change."""
        servers = dict(self.state.scan(SERVERS))
        on_change(servers)
        async with aclosing(self._subscribe(SERVERS, self.state.position)) as changes:
            async for change in changes:
                if isinstance(change, Reset):
                    servers = dict(change.items)
                elif change.value is None:
                    servers.pop(change.key, None)
                else:
                    servers[change.key] = change.value
                on_change(servers)

    def announce(self, name: str, addresses: list[str]) -> None:
        """Record this appliance's server identifiers for the others (when it may write)."""
        if self.state.get(SERVERS, name) != addresses:
            self.state.append(SERVERS, name, addresses)

    # -- the journal of earlier releases -------------------------------------------------------

    def load_legacy(self) -> None:
        """Read ``<data_dir>/dhcp/leases.journal`` if there is one (blocking): its leases are
        imported once this node may write. Damage is recovered around as it always was
        (appliance/journal.py) and reported in status."""
        path = self.legacy_path
        if path is None or not path.exists():
            return
        journal = JournalFile(path, max_record=MAX_RECORD_BYTES + 64)
        table, corrupt = LeaseTable(), 0
        try:
            for payload in journal.open():
                try:
                    table.apply(decode_lease_untrusted(payload))
                except CorruptRecord as exc:
                    corrupt += 1
                    log.error("skipping an unreadable record of the old lease journal",
                              path=str(path), error=str(exc))  # fmt: skip
            damage = journal.damage
        finally:
            journal.close()
        self.legacy = list(table)
        self.legacy_report = {"path": str(path), "leases": len(self.legacy), "imported": False,
                              "corrupt": corrupt, "damage": damage}  # fmt: skip
        log.warning("found the lease journal of an earlier release: its leases are imported "
                    "into the state log once this node is active", path=str(path),
                    leases=len(self.legacy))  # fmt: skip

    def import_legacy(
        self, on_done: Callable[[], object], on_abandoned: Callable[[], object]
    ) -> bool:
        """Append the old journal's leases the rack does not know yet, pending in the view
        until committed; ``on_done()`` once all committed, ``on_abandoned()`` if the rack's
        lease was lost first. False if nothing to do or under way; :class:`NotWriter` if this
        node may not write.

        A lease is imported unless the state already has a record of its address or of its
        client (those are newer: written since the upgrade); what is skipped is logged. Run
        again after a crash, everything is then known and nothing is appended twice."""
        if self.legacy is None or self._importing:
            return False
        view = self.view
        chosen, skipped = [], []
        for lease in self.legacy:
            if view.get(lease.address) is None and view.of_client(lease.client) is None:
                chosen.append(lease)
            else:
                skipped.append(lease)
        if skipped:
            log.warning("leases of the old journal the state log already knows newer records "
                        "of were not imported", skipped=len(skipped),
                        addresses=",".join(address_text(x.address) for x in skipped[:16]))  # fmt: skip
        if not chosen:
            on_done()
            return True
        for lease in chosen:  # blocked for others before anything is appended
            view.add(lease)
        self._importing = True

        def abandoned() -> None:
            self._importing = False
            on_abandoned()
            log.warning("importing the old lease journal was interrupted (this node lost the "
                        "rack's lease); it is taken up again when it is active")  # fmt: skip

        def durable() -> None:
            self._importing = False
            self.legacy_report["imported"] = len(chosen)
            on_done()

        try:
            self.commit(chosen, durable, abandoned)
        except NotWriter:
            self._importing = False
            raise
        log.info("importing the old lease journal", leases=len(chosen))
        return True

    async def retire_legacy(self) -> None:
        """Rename the imported journal aside (durably); it is never read again."""
        path = self.legacy_path
        assert path is not None
        target = path.with_name(path.name + IMPORTED)

        def rename() -> None:
            os.replace(path, target)
            fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        await trio.to_thread.run_sync(rename)
        self.legacy = None
        self.legacy_report["file"] = str(target)
        log.info("imported the old lease journal into the state log and renamed it",
                 path=str(path), renamed=str(target),
                 leases=self.legacy_report.get("imported", 0))  # fmt: skip

    # -- operators --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "namespace": NAMESPACE,
            "leases": len(self.table),
            "pending": self.view.pending(),
            "lsn": self.table.lsn,
            **self.counters,
        }
        return out


def _written(lease: Lease) -> float:
    """About when ``lease``'s record was written: a release or an expiry at its end."""
    return (
        lease.expires if lease.state in (LeaseState.RELEASED, LeaseState.EXPIRED) else lease.starts
    )


def _guarded(callback: Callable[[], object]) -> None:
    """A callback runs inside the state store's commit: its failure must not stop the writer."""
    try:
        callback()
    except Exception as exc:
        log.error("lease commit callback failed", error=f"{type(exc).__name__}: {exc}")
