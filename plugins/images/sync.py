"""Fetching an image version this node lacks (trio shell; the plan is plan.py's).

For a signed head the rack committed: the chunk table (from the store, else
from a peer, as a delta against a table this node has, checked against the
head's digest), then a **partial file** the size of the image with a
**completion bitmap** beside it (``<store>/partial/NAME/VERSION`` and
``.done``), then:

1. seeds: chunks this node holds in other versions or images are copied from
   them (``copy_file_range``, adjacent chunks merged into one copy), zero
   chunks are left as holes (or written, on a resumed file);
2. the rest in runs of consecutive chunks, one HTTP Range request each
   (``GET /images/NAME/VERSION`` on a peer's httpboot server), from every
   peer at once: each worker takes the next run; every chunk is checked
   against its id once it is in place (written by ``splice(2)``, read back
   through the file's mapping); a chunk that does not match, or a peer that
   fails, puts the rest of the run back for the other peers, and that peer is
   not asked again in this sync;
3. the bitmap is saved after the data it covers is on disk (``fdatasync``
   first), every ``SAVE_EVERY`` bytes and at the end: a sync killed at any
   instant resumes without fetching a chunk it had;
4. complete (every chunk checked on arrival, or a seed from a complete
   version, checked when that one was assembled): made read-only and renamed
   into ``files/`` with its head: only then is it served.

A full disk (``ENOSPC``) stops the sync with :class:`SyncError`; what was
written stays for the next attempt and no complete version is touched.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
from collections import Counter, deque
from dataclasses import dataclass, field

import trio

from appliance.logs import get_logger

from .chunking import zero_id
from .manifest import BadManifest, Head, Table, apply_untrusted, decode_table_untrusted
from .manifest import open_untrusted as open_head_untrusted
from .patch import CONTENT_TYPE, MAX_PATCH_HEAD, Anchors, BadPatch, apply_patch_untrusted
from .peer import Peer, PeerError
from .plan import RUN_BYTES, Bitmap, Run, make_plan
from .store import ImageStore, Location, Version

log = get_logger("images.sync")

SAVE_EVERY = 64 << 20  # bytes fetched between bitmap saves
MAX_TABLE_RESPONSE = 128 << 20


class SyncError(Exception):
    """A version could not be assembled now; the text says why."""


@dataclass
class SyncStats:
    versions: int = 0
    bytes_fetched: int = 0  # chunk bytes from peers (accepted)
    chunks_fetched: int = 0
    chunks_seeded: int = 0  # copied from this node's other versions
    chunks_zero: int = 0
    table_bytes: int = 0  # chunk tables (or their deltas) fetched
    refused: Counter[str] = field(default_factory=Counter)  # by reason
    by_peer: Counter[str] = field(default_factory=Counter)  # bytes accepted from each peer
    resumed: int = 0
    patched_runs: int = 0  # runs sent as a patch of an older version's bytes (patch.py)
    patch_bytes: int = 0
    last_error: str = ""

    def as_dict(self) -> dict:
        return {k: dict(v) if isinstance(v, Counter) else v for k, v in self.__dict__.items()}


class RateLimit:
    """A token bucket over every worker of a sync (bytes per second; 0: none)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.allowance = 0.0
        self.stamp = trio.current_time()

    async def take(self, n: int) -> None:
        if not self.rate:
            return
        now = trio.current_time()
        self.allowance = min(self.allowance + (now - self.stamp) * self.rate, self.rate)
        self.stamp = now
        self.allowance -= n
        if self.allowance < 0:
            await trio.sleep(-self.allowance / self.rate)


class Syncer:
    def __init__(self, store: ImageStore, rate: float = 0.0, save_every: int = SAVE_EVERY,
                 run_bytes: int = RUN_BYTES) -> None:  # fmt: skip
        self.store = store
        self.rate = rate
        self.save_every = save_every
        self.run_bytes = run_bytes
        self.stats = SyncStats()

    async def fetch(self, envelope: bytes, peers: list[Peer]) -> Version:
        """Assemble the version ``envelope`` names from ``peers`` (and this node's seeds)."""
        try:
            head = open_head_untrusted(envelope, self.store.trust)
        except BadManifest as exc:
            self.stats.refused["head"] += 1
            raise SyncError(f"refused a head: {exc}") from None
        have = self.store.images.get(head.name, {}).get(head.version)
        if have is not None:
            return have
        table = await self._table(head, peers)
        job = _Job(self, head, envelope, table, peers)
        try:
            return await job.run()
        except (OSError, BaseExceptionGroup) as caught:  # the workers' nursery groups them
            exc = _os_error(caught)
            if exc is None:
                raise
            if exc.errno == errno.ENOSPC:
                raise SyncError(f"{head.key}: the disk is full; kept what was written") from None
            where = f"{exc.filename}: " if exc.filename else ""
            raise SyncError(f"{head.key}: {where}{exc.strerror or exc}") from None

    async def _table(self, head: Head, peers: list[Peer]) -> Table:
        path = self.store.table_path(head.table)
        if path.exists():
            data = await trio.to_thread.run_sync(path.read_bytes)
            return decode_table_untrusted(data, head.table)
        base = self._base_table(head.name)
        query = f"?base={base.digest().hex()}" if base is not None else ""
        for peer in peers:
            try:
                async with peer.request(
                    "GET", f"/images/_table/{head.table.hex()}{query}"
                ) as response:
                    body = bytearray()
                    async for piece in response.body:
                        body += piece
                        if len(body) > MAX_TABLE_RESPONSE:
                            raise PeerError(f"{peer}: table response too large")
                if response.status != 200:
                    continue
                self.stats.table_bytes += len(body)
                delta = response.headers.get(b"x-rackboot-delta-base")
                if delta is not None and base is not None and delta == base.digest().hex().encode():
                    table = apply_untrusted(base, bytes(body), head.table)
                else:
                    table = decode_table_untrusted(bytes(body), head.table)
            except PeerError as exc:
                log.info("table not fetched", peer=str(peer), error=str(exc))
                continue
            except BadManifest as exc:
                self.stats.refused["table"] += 1
                log.warning("table refused", peer=str(peer), image=head.key, error=str(exc))
                continue
            if (
                table.params != head.params
                or table.size != head.size
                or len(table.ids) != head.chunks
            ):
                self.stats.refused["table"] += 1
                continue
            await trio.to_thread.run_sync(self.store.save_table, table)
            return table
        raise SyncError(f"{head.key}: no peer gave its chunk table")

    def _base(self, name: str) -> Version | None:
        """The newest version of the image held here: the base of deltas and patches."""
        versions = self.store.images.get(name) or {}
        return max(versions.values(), key=lambda v: v.head.created) if versions else None

    def _base_table(self, name: str) -> Table | None:
        base = self._base(name)
        return None if base is None else base.table


class _Job:
    def __init__(self, syncer: Syncer, head: Head, envelope: bytes, table: Table,
                 peers: list[Peer]) -> None:  # fmt: skip
        self.syncer, self.stats, self.store = syncer, syncer.stats, syncer.store
        self.head, self.envelope, self.table, self.peers = head, envelope, table, peers
        self.path = self.store.partial_path(head.name, head.version)
        self.done_path = self.path.with_name(self.path.name + ".done")
        self.offsets = table.offsets()
        self.fd = -1
        self.map: mmap.mmap | None = None  # the partial file, read back to check chunks
        self.unsaved = 0
        self.saving = trio.Lock()
        self.bitmap = Bitmap(len(table.ids))
        self.base = syncer._base(head.name)
        self.anchors = None if self.base is None else Anchors(self.base.table)

    async def run(self) -> Version:
        resumed = await trio.to_thread.run_sync(self._open)
        try:
            held = self.store.index.get
            plan = make_plan(self.table, held, self._is_zero, self.bitmap,
                             self.syncer.run_bytes)  # fmt: skip
            if resumed:
                self.stats.resumed += 1
                log.info(
                    "sync resumed", image=self.head.key, done=plan.done, chunks=len(self.table.ids)
                )
            await trio.to_thread.run_sync(self._seed, plan.local, plan.zero, resumed)
            if plan.runs:
                self.map = mmap.mmap(self.fd, self.head.size, prot=mmap.PROT_READ)
                await self._fetch_all(deque(plan.runs))
            await trio.to_thread.run_sync(self._save)
        finally:
            if self.map is not None:
                self.map.close()
            os.close(self.fd)
        if not self.bitmap.all():  # every chunk was written and checked, or a seed
            raise SyncError(f"{self.head.key}: assembled with chunks missing")
        version = await trio.to_thread.run_sync(
            self.store.adopt, self.envelope, self.table, self.path
        )
        self.done_path.unlink(missing_ok=True)
        self.stats.versions += 1
        log.info("image synced", image=self.head.key, bytes=self.head.size)
        return version

    def _is_zero(self, chunk: bytes, size: int) -> bool:
        # A run of zeros never makes FastCDC cut before max_size: its chunks have that
        # size (a shorter all-zero chunk, at a run's end, is fetched like any other).
        return size == self.table.params.max_size and chunk == zero_id(size)

    # -- the partial file and its bitmap (worker threads) ------------------------------

    def _open(self) -> bool:
        self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        resumed = False
        if self.path.exists() and self.done_path.exists():
            bitmap = Bitmap(len(self.table.ids), self.done_path.read_bytes())
            if self.path.stat().st_size == self.head.size:
                self.bitmap, resumed = bitmap, True
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if not resumed:
            os.ftruncate(self.fd, 0)
            os.ftruncate(self.fd, self.head.size)  # holes: the zero chunks cost nothing
        return resumed

    def _seed(self, local: list[tuple[int, Location]], zero: list[int], resumed: bool) -> None:
        start = 0
        while start < len(local):  # chunks adjacent here and in the seed: one copy
            end = start + 1
            while (end < len(local) and local[end][0] == local[end - 1][0] + 1
                   and local[end][1].path == local[start][1].path
                   and local[end][1].offset == local[end - 1][1].offset + local[end - 1][1].size):  # fmt: skip
                end += 1
            first, where = local[start]
            size = sum(self.table.sizes[i] for i, _ in local[start:end])
            with open(where.path, "rb") as src:
                _copy_range(src.fileno(), self.fd, where.offset, self.offsets[first], size)
            for i, _ in local[start:end]:
                self.bitmap.set(i)
            start = end
        for i in zero:
            if resumed:  # a resumed file may hold anything there
                os.pwrite(self.fd, bytes(self.table.sizes[i]), self.offsets[i])
            self.bitmap.set(i)
        self.stats.chunks_seeded += len(local)
        self.stats.chunks_zero += len(zero)
        self._save()

    async def _save_soon(self) -> None:
        """Save from a worker: one save at a time (every worker's thread would rename the
        same temporary file), and none if another worker's save just covered this."""
        async with self.saving:
            if self.unsaved >= self.syncer.save_every:
                # The bits as they are now: chunks checked meanwhile are written after the
                # fdatasync began and must wait for the next save.
                snapshot, self.unsaved = self.bitmap.encode(), 0
                await trio.to_thread.run_sync(self._save, snapshot)

    def _save(self, snapshot: bytes | None = None) -> None:
        os.fdatasync(self.fd)  # the data first: the bitmap never claims what is not on disk
        tmp = self.done_path.with_name(self.done_path.name + ".tmp")
        tmp.write_bytes(self.bitmap.encode() if snapshot is None else snapshot)
        os.replace(tmp, self.done_path)
        if snapshot is None:
            self.unsaved = 0

    def _discard(self) -> None:
        self.path.unlink(missing_ok=True)
        self.done_path.unlink(missing_ok=True)

    # -- fetching (trio) --------------------------------------------------------------

    async def _fetch_all(self, runs: deque[Run]) -> None:
        if not runs:
            return
        limit = RateLimit(self.syncer.rate)
        usable = list(self.peers)
        while runs and usable:  # again: a failed peer's run may come back after others quit
            async with trio.open_nursery() as nursery:
                for peer in list(usable):
                    nursery.start_soon(self._worker, peer, runs, usable, limit)
        if runs:
            raise SyncError(f"{self.head.key}: {len(runs)} runs of chunks no peer could give")

    async def _worker(
        self, peer: Peer, runs: deque[Run], usable: list[Peer], limit: RateLimit
    ) -> None:
        while runs and peer in usable:
            run = runs.popleft()
            try:
                await self._fetch_run(peer, run, limit)
            except (PeerError, _BadChunk) as exc:
                usable.remove(peer)
                rest = next((i for i in range(run.first, run.end) if not self.bitmap[i]), run.end)
                if rest < run.end:
                    runs.appendleft(Run(rest, run.end, self.offsets[rest],
                                        run.offset + run.size - self.offsets[rest]))  # fmt: skip
                self.stats.refused["chunk" if isinstance(exc, _BadChunk) else "peer"] += 1
                log.warning("peer dropped from this sync", peer=str(peer), image=self.head.key,
                            error=str(exc))  # fmt: skip
                return

    async def _patched_run(self, peer: Peer, run: Run, response, replaced: tuple[int, int],
                           limit: RateLimit) -> None:  # fmt: skip
        """The run rebuilt from a patch of the base's bytes ``replaced`` (patch.py)."""
        patch = await _read_all(response.body, 2 * run.size + MAX_PATCH_HEAD, peer)
        await limit.take(len(patch))
        assert self.base is not None
        start, stop = replaced
        with open(self.base.path, "rb") as f:
            old = await trio.to_thread.run_sync(os.pread, f.fileno(), stop - start, start)
        try:
            data = apply_patch_untrusted(patch, old, run.size)
        except BadPatch as exc:
            raise _BadChunk(f"{peer}: {exc}") from None
        self.stats.patched_runs += 1
        self.stats.patch_bytes += len(patch)
        view = memoryview(data)
        at = 0
        for i in range(run.first, run.end):
            size = self.table.sizes[i]
            self._write_chunk(peer, i, view[at : at + size])
            at += size
        self.stats.bytes_fetched += len(patch)
        self.stats.by_peer[str(peer)] += len(patch)

    def _write_chunk(self, peer: Peer, i: int, chunk) -> None:
        """Check chunk ``i`` (rebuilt from a patch) against its id and write it in place."""
        if hashlib.sha256(chunk).digest() != self.table.ids[i]:
            raise _BadChunk(f"{peer}: chunk {i} of {self.head.key} does not match its id")
        os.pwrite(self.fd, chunk, self.offsets[i])
        self.bitmap.set(i)
        self.stats.chunks_fetched += 1
        self.unsaved += len(chunk)

    def _count_chunk(self, peer: Peer, i: int, size: int) -> None:
        self.bitmap.set(i)
        self.stats.chunks_fetched += 1
        self.stats.bytes_fetched += size
        self.stats.by_peer[str(peer)] += size
        self.unsaved += size

    async def _fetch_run(self, peer: Peer, run: Run, limit: RateLimit) -> None:
        target = f"/images/{self.head.name}/{self.head.version}"
        ranged = [("range", f"bytes={run.offset}-{run.offset + run.size - 1}")]
        replaced = (None if self.anchors is None
                    else self.anchors.range(self.table, self.offsets, run.first, run.end))  # fmt: skip
        if replaced is not None and self.base is not None:  # ask for a patch of what we hold
            target += f"?base={self.base.head.version}&from={replaced[0]}&to={replaced[1]}"
        async with peer.request("GET", target, ranged) as response:
            if (
                response.status == 200
                and replaced is not None
                and (response.headers.get(b"content-type") == CONTENT_TYPE)
            ):
                await self._patched_run(peer, run, response, replaced, limit)
                return
            if response.status != 206 or response.headers.get(b"content-range", b"").split(b"/")[
                0
            ] != (f"bytes {run.offset}-{run.offset + run.size - 1}".encode()):
                async for _ in response.body:
                    pass
                raise PeerError(f"{peer}: answered {response.status} for {target}")
            await self._stream_run(peer, run, response, limit)

    async def _stream_run(self, peer: Peer, run: Run, response, limit: RateLimit) -> None:
        """Write the run in place as it arrives (spliced, peer.py) and check each chunk
        against its id once all of it is in the file (read back through the file's
        mapping: no copy); a chunk counts (its bit set) only then. A chunk that does
        not match leaves bytes on disk that no bit vouches for: they are written again
        by whoever fetches it next."""
        if response.length != run.size:
            raise PeerError(f"{peer}: a body of {response.length} bytes for a run of {run.size}")
        i, received = run.first, 0
        with memoryview(self.map) as view:
            async for landed in peer.write_body(response, self.fd, run.offset):
                await limit.take(landed - received)
                received = landed
                while i < run.end and self.offsets[i] + self.table.sizes[i] <= run.offset + landed:
                    at, size = self.offsets[i], self.table.sizes[i]  # no slice outlives this
                    if hashlib.sha256(view[at : at + size]).digest() != self.table.ids[i]:
                        raise _BadChunk(f"{peer}: chunk {i} of {self.head.key} does not match")
                    self._count_chunk(peer, i, self.table.sizes[i])
                    i += 1
                if self.unsaved >= self.syncer.save_every:
                    await self._save_soon()


async def _read_all(body, limit: int, peer: Peer) -> bytes:
    data = bytearray()
    async for piece in body:
        data += piece
        if len(data) > limit:
            raise PeerError(f"{peer}: a patch longer than its run")
    return bytes(data)


class _BadChunk(Exception):
    pass


def _copy_range(src: int, dst: int, src_offset: int, dst_offset: int, size: int) -> None:
    while size:
        try:
            n = os.copy_file_range(src, dst, size, src_offset, dst_offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            n = os.pwrite(dst, os.pread(src, min(size, 1 << 20), src_offset), dst_offset)
        if n == 0:
            raise OSError(errno.EIO, "the seed file ended early")
        src_offset, dst_offset, size = src_offset + n, dst_offset + n, size - n


def _os_error(exc: BaseException) -> OSError | None:
    """The first OSError in ``exc``, through exception groups; None if there is none."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _os_error(inner)) is not None:
                return found
    return None
