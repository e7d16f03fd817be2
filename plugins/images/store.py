"""The image store on disk (blocking file work; the plugin calls it from a worker thread).

Layout under the store's root (``[images] root``, default ``<data_dir>/images``)::

    heads/<name>/<version>.head   signed heads (manifest.seal), written last
    tables/<sha256 hex>           chunk tables, content-addressed
    files/<name>/<version>        the assembled image, read-only: what is served
    current/<name>                symlink to ../files/<name>/<version>: the version served
    tmp/                          files being added; emptied at load and by gc

There is no separate chunk directory: a chunk lives in the assembled files
that contain it, found through an in-memory index (chunk id -> file, offset,
size), so a store holds each image version once and serves it with sendfile.
Every step that makes a version visible is an atomic rename after an fsync,
in this order: the file, its table, its head; a crash leaves an orphan that
:meth:`ImageStore.load` ignores and :meth:`ImageStore.gc` removes, never a head
whose file is missing or partial.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from appliance.durable import fsync_directory
from appliance.errors import RackbootError

from .chunking import check_file, chunk_file
from .manifest import BadManifest, Head, Params, Table, Trust, check_name, decode_table_untrusted
from .manifest import open_untrusted as open_head_untrusted

Sealer = Callable[[Head], bytes]  # signs a head with this node's key: manifest.seal


class ImageError(RackbootError):
    """An image operation refused: the text says which image and why."""


@dataclass(frozen=True)
class Version:
    """One complete version in the store."""

    head: Head
    envelope: bytes  # the signed head, as replicated
    table: Table
    path: Path


@dataclass(frozen=True)
class Location:
    path: Path
    offset: int
    size: int


class ImageStore:
    def __init__(self, root: Path, trust: Trust) -> None:
        self.root = root
        self.trust = trust
        self.images: dict[str, dict[str, Version]] = {}
        self.current: dict[str, str] = {}
        self.index: dict[bytes, Location] = {}  # chunk id -> where a complete file holds it
        self.problems: list[str] = []  # heads refused at load, with why

    # -- reading ----------------------------------------------------------------

    def load(self) -> None:
        """Read every head, keep the versions whose signature, table and file check out
        (the file's length; :meth:`verify` reads it all), and the current links."""
        for sub in ("heads", "tables", "files", "current", "tmp", "partial"):
            (self.root / sub).mkdir(mode=0o755, parents=True, exist_ok=True)
        shutil.rmtree(self.root / "tmp", ignore_errors=True)
        (self.root / "tmp").mkdir(mode=0o755, exist_ok=True)
        self.images, self.problems = {}, []
        for head_path in sorted((self.root / "heads").glob("*/*.head")):
            try:
                version = self._read_version(head_path.read_bytes())
            except (OSError, BadManifest, ImageError) as exc:
                self.problems.append(f"{head_path.relative_to(self.root)}: {exc}")
                continue
            self.images.setdefault(version.head.name, {})[version.head.version] = version
        self.current = {}
        for link in (self.root / "current").iterdir():
            target = os.readlink(link) if link.is_symlink() else ""
            version = Path(target).name
            if version in self.images.get(link.name, {}):
                self.current[link.name] = version
        for name in self.images:  # a current link lost in a crash: the newest
            if name not in self.current:
                self._set_current(name, self._newest(name))
        self._reindex()

    def _read_version(self, envelope: bytes) -> Version:
        head = open_head_untrusted(envelope, self.trust)
        table = decode_table_untrusted(self.table_path(head.table).read_bytes(), head.table)
        if len(table.ids) != head.chunks or table.size != head.size or table.params != head.params:
            raise BadManifest("the chunk table does not describe the head's image")
        path = self._file_path(head.name, head.version)
        if path.stat().st_size != head.size:
            raise ImageError(
                f"{head.key}: the file has {path.stat().st_size} bytes, not {head.size}"
            )
        return Version(head, envelope, table, path)

    def get(self, name: str, version: str | None = None) -> Version:
        versions = self.images.get(name)
        if not versions:
            raise ImageError(f"no image named {name!r}")
        chosen = version or self.current.get(name) or self._newest(name)
        if chosen not in versions:
            raise ImageError(f"image {name!r} has no version {chosen!r} "
                             f"(it has {', '.join(sorted(versions))})")  # fmt: skip
        return versions[chosen]

    def served_path(self, name: str) -> Path | None:
        """The current version's file of image ``name``, or None."""
        version = self.current.get(name)
        return None if version is None else self.images[name][version].path

    def verify(self, name: str, version: str | None = None) -> str | None:
        """Read a version whole: why it is not what its signed head says, or None."""
        found = self.get(name, version)
        return check_file(found.path, found.table, found.head.sha256)

    # -- writing ----------------------------------------------------------------

    def add(self, name: str, source: Path, version: str | None, params: Params, seal: Sealer,
            now: float) -> Version:  # fmt: skip
        """Copy ``source`` in as a new version of ``name`` (the next integer after the
        highest integer version when ``version`` is None) and make it current."""
        for kind, value in (("name", name), ("version", version)):
            if value is not None and (why := check_name(kind, value)) is not None:
                raise ImageError(f"image {kind} {value!r}: expected {why}")
        if version is None:
            numbers = [int(v) for v in self.images.get(name, {}) if v.isdigit()]
            version = str(max(numbers, default=0) + 1)
        if version in self.images.get(name, {}):
            raise ImageError(f"image {name}@{version} exists: give another --version, or rm it")
        if not source.is_file():
            raise ImageError(f"{source}: not a regular file")
        tmp = self.root / "tmp" / f"{name}@{version}.{os.getpid()}"
        try:
            shutil.copyfile(source, tmp)  # the copy is what gets cut: source may change
            _fsync(tmp)
            table, sha = chunk_file(tmp, params)
            head = Head(name, version, table.size, sha, params, table.digest(), len(table.ids),
                        now, "")  # fmt: skip
            envelope = seal(head)
            head = open_head_untrusted(envelope, self.trust)  # what seal filled in, checked
            os.chmod(tmp, 0o444)
            path = self._file_path(name, version)
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.replace(tmp, path)
            fsync_directory(path.parent)
        finally:
            tmp.unlink(missing_ok=True)
        self.save_table(table)
        self._write(self._head_path(name, version), envelope)
        found = Version(head, envelope, table, path)
        self.images.setdefault(name, {})[version] = found
        self._set_current(name, version)
        self._reindex()
        return found

    def remove(self, name: str, version: str) -> None:
        """Delete one version (its head first: a crash leaves an orphan file for gc)."""
        found = self.get(name, version)
        self._head_path(name, version).unlink()
        fsync_directory(self._head_path(name, version).parent)
        found.path.unlink(missing_ok=True)
        del self.images[name][version]
        if not self.images[name]:
            del self.images[name]
            self.current.pop(name, None)
            (self.root / "current" / name).unlink(missing_ok=True)
        elif self.current.get(name) == version:
            self._set_current(name, self._newest(name))
        self._reindex()

    def gc(self, keep: int) -> list[str]:
        """Keep the current version and the newest others up to ``keep`` per image;
        delete the rest, then files, tables and links nothing refers to. What went."""
        removed = []
        for name in list(self.images):
            others = sorted((v for v in self.images[name] if v != self.current.get(name)),
                            key=lambda v: self.images[name][v].head.created, reverse=True)  # fmt: skip
            for version in others[max(keep - 1, 0) :]:
                self.remove(name, version)
                removed.append(f"{name}@{version}")
        tables = {v.head.table.hex() for vs in self.images.values() for v in vs.values()}
        files = {v.path for vs in self.images.values() for v in vs.values()}
        for path in (self.root / "tables").iterdir():
            if path.name not in tables:
                path.unlink()
        for path in (self.root / "files").glob("*/*"):
            if path not in files:
                path.unlink()
                removed.append(f"orphan file {path.relative_to(self.root)}")
        for path in (self.root / "heads").glob("*/*.head"):
            if (
                path.parent.name not in self.images
                or path.stem not in self.images[path.parent.name]
            ):
                path.unlink()  # refused at load
                removed.append(f"refused head {path.relative_to(self.root)}")
        shutil.rmtree(self.root / "tmp", ignore_errors=True)
        (self.root / "tmp").mkdir(mode=0o755, exist_ok=True)
        return removed

    def prune_partials(self, wanted: set[str]) -> list[str]:
        """Delete the partial files (and bitmaps) of syncs of versions not in ``wanted``
        (``NAME@VERSION``: those the rack still commits) or held here already; what went."""
        removed = []
        for path in sorted((self.root / "partial").glob("*/*")):
            name, held = path.parent.name, self.images.get(path.parent.name, {})
            # VERSION, its bitmap VERSION.done, and VERSION.done.tmp (a version may hold dots)
            of = {path.name.removesuffix(suffix) for suffix in ("", ".done", ".done.tmp")}
            if not any(f"{name}@{v}" in wanted and v not in held for v in of):
                path.unlink(missing_ok=True)
                removed.append(f"partial {path.relative_to(self.root)}")
        return removed

    def adopt(self, envelope: bytes, table: Table, partial: Path) -> Version:
        """A version assembled by a sync (``partial``, checked whole by the caller): made
        read-only and renamed in, its head written last, like :meth:`add`."""
        head = open_head_untrusted(envelope, self.trust)
        os.chmod(partial, 0o444)
        path = self._file_path(head.name, head.version)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.replace(partial, path)
        fsync_directory(path.parent)
        self.save_table(table)
        self._write(self._head_path(head.name, head.version), envelope)
        found = Version(head, envelope, table, path)
        self.images.setdefault(head.name, {})[head.version] = found
        if head.name not in self.current:
            self._set_current(head.name, head.version)
        self._reindex()
        return found

    def set_current(self, name: str, version: str) -> bool:
        """Serve ``version`` of ``name`` (the rack's choice); False if not held here."""
        if version not in self.images.get(name, {}):
            return False
        if self.current.get(name) != version:
            self._set_current(name, version)
        return True

    def save_table(self, table: Table) -> None:
        path = self.table_path(table.digest())
        if not path.exists():
            self._write(path, table.encode())

    def table_path(self, digest: bytes) -> Path:
        return self.root / "tables" / digest.hex()

    def partial_path(self, name: str, version: str) -> Path:
        return self.root / "partial" / name / version

    # -- internals ----------------------------------------------------------------

    def _newest(self, name: str) -> str:
        return max(self.images[name].values(), key=lambda v: v.head.created).head.version

    def _set_current(self, name: str, version: str) -> None:
        link = self.root / "current" / name
        tmp = link.with_name(f".{name}.tmp")
        tmp.unlink(missing_ok=True)
        os.symlink(f"../files/{name}/{version}", tmp)
        os.replace(tmp, link)
        fsync_directory(link.parent)
        self.current[name] = version

    def _reindex(self) -> None:
        index: dict[bytes, Location] = {}
        for versions in self.images.values():
            for found in versions.values():
                for chunk, offset, size in zip(found.table.ids, found.table.offsets(),
                                               found.table.sizes, strict=True):  # fmt: skip
                    index.setdefault(chunk, Location(found.path, offset, size))
        self.index = index

    def _write(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        _fsync(tmp)
        os.replace(tmp, path)
        fsync_directory(path.parent)

    def _head_path(self, name: str, version: str) -> Path:
        return self.root / "heads" / name / f"{version}.head"

    def _file_path(self, name: str, version: str) -> Path:
        return self.root / "files" / name / version


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

