"""Keeping a node's store equal to what the rack committed (trio shell).

Two changefeeds of the state log drive it: ``images`` (``NAME@VERSION`` -> the
signed head, or deleted) and ``images.current`` (``NAME`` -> the version
served). A head committed that this node lacks is synced from its peers
(sync.py), the versions the rack serves first; a head deleted is removed here
too; the version served follows the rack's choice once it is held here.
A version added on this node and not committed (a standby's) is left alone.
A sync that fails is tried again after ``RETRY`` seconds, or at the next change.
"""

from __future__ import annotations

from typing import Any

import trio

from appliance.logs import get_logger
from appliance.state.store import Change, Reset

from .peer import Peer
from .store import ImageError, ImageStore
from .sync import Syncer, SyncError

log = get_logger("images.sync")

HEADS_NS, CURRENT_NS = "images", "images.current"
REMOVED_NS = "images.removed"  # NAME@VERSION -> True: removed in the rack
RETRY = 30.0


class Follower:
    def __init__(
        self, state: Any, store: ImageStore, syncer: Syncer, peers: list[Peer], lock: trio.Lock,
        in_use: frozenset[str] = frozenset(),
    ) -> None:  # fmt: skip
        self.state, self.store, self.syncer = state, store, syncer
        self.peers, self.lock = peers, lock
        self.in_use = in_use  # image names boot profiles load (image:NAME): synced first
        self.committed: dict[str, bytes] = {}  # NAME@VERSION -> signed head
        self.current: dict[str, str] = {}  # NAME -> version, as the rack serves it
        self.deleted: set[str] = set()
        self.changed = trio.Event()
        self.failing: dict[str, str] = {}  # NAME@VERSION -> why its last sync failed

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow, HEADS_NS, self.committed)
            nursery.start_soon(self._follow, CURRENT_NS, self.current)
            nursery.start_soon(self._reconcile)

    async def _follow(self, ns: str, table: dict[str, Any]) -> None:
        async for change in self.state.subscribe(ns):
            if isinstance(change, Reset):
                gone = set(table) - set(change.items)
                table.clear()
                table.update({k: v for k, v in change.items.items() if v is not None})
            elif isinstance(change, Change):
                gone = {change.key} if change.value is None else set()
                if change.value is None:
                    table.pop(change.key, None)
                else:
                    table[change.key] = change.value
            if ns == HEADS_NS:
                self.deleted |= gone
            self.changed.set()

    def missing(self) -> list[str]:
        """Committed versions this node lacks: first those the rack serves of images boot
        profiles load, then the others it serves, then older versions."""
        held = {f"{n}@{v}" for n, versions in self.store.images.items() for v in versions}
        served = {f"{n}@{v}" for n, v in self.current.items()}

        def order(key: str) -> tuple[bool, bool, str]:
            loaded = key in served and key.partition("@")[0] in self.in_use
            return (not loaded, key not in served, key)

        return sorted(set(self.committed) - held, key=order)

    async def _reconcile(self) -> None:
        while True:
            self.changed = trio.Event()
            retry = False
            async with self.lock:
                await self._remove_deleted()
                await self._prune_partials()
                for key in self.missing():
                    try:
                        await self.syncer.fetch(self.committed[key], self.peers)
                        self.failing.pop(key, None)
                    except Exception as exc:  # a bug here must not stop the node's service
                        if not isinstance(exc, SyncError):
                            log.error("image sync crashed", image=key,
                                      error=f"{type(exc).__name__}: {exc}")  # fmt: skip
                        self.failing[key] = str(exc)
                        self.syncer.stats.last_error = str(exc)
                        log.warning("image not synced", image=key, error=str(exc))
                        retry = True
                # The table as committed now, not as the feed has told it so far: an add
                # on this node commits its version under the same lock.
                for name, version in list(self.state.scan(CURRENT_NS)):
                    if version is not None:
                        await trio.to_thread.run_sync(self.store.set_current, name, version)
            with trio.move_on_after(RETRY if retry else float("inf")):
                await self.changed.wait()

    async def _prune_partials(self) -> None:
        """Half-synced versions the rack no longer commits (removed while this node was
        syncing them, or down) would hold their disk space for ever."""
        wanted = {key for key, head in self.state.scan(HEADS_NS) if head is not None}
        try:
            pruned = await trio.to_thread.run_sync(self.store.prune_partials, wanted)
        except OSError as exc:
            log.warning("partial files not pruned", error=str(exc))
            return
        for path in pruned:
            log.info("partial file of a version no longer committed removed", path=path)

    async def _remove_deleted(self) -> None:
        deleted, self.deleted = self.deleted, set()
        for key in deleted - set(self.committed):
            name, _, version = key.partition("@")
            if version in self.store.images.get(name, {}):
                try:
                    await trio.to_thread.run_sync(self.store.remove, name, version)
                    log.info("image version removed, as the rack did", image=key)
                except (ImageError, OSError) as exc:
                    log.warning("image version not removed", image=key, error=str(exc))
