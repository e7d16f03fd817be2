"""The bundle of a roll, kept by its SHA-256 under ``<data_dir>/rolling/bundles`` and
passed between appliances in chunks over the cluster's peer links (trio shell)."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from appliance.errors import RackbootError

CHUNK = 256 * 1024  # bytes per request: well under a peer link's message cap (1 MiB)
MAX_BUNDLE = 8 * 1024**3
DIGEST = re.compile(r"[0-9a-f]{64}")
Call = Callable[[str, str, dict[str, Any]], Awaitable[Any]]


class Bundles:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, digest: str) -> Path:
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise RackbootError(f"not a bundle digest: {str(digest)[:80]!r}")
        return self.directory / f"{digest}.bundle"

    def has(self, digest: str, size: int) -> bool:
        try:
            return self.path(digest).stat().st_size == size
        except FileNotFoundError:
            return False

    def stage(self, source: Path) -> tuple[str, int]:
        """Copy ``source`` in (blocking), hashing it on the way: (digest, size)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        part = self.directory / f"staging-{os.getpid()}.part"
        digest, size = hashlib.sha256(), 0
        try:
            with open(source, "rb") as src, open(part, "wb") as out:
                while block := src.read(1024 * 1024):
                    digest.update(block)
                    out.write(block)
                    size += len(block)
                    if size > MAX_BUNDLE:
                        raise RackbootError(f"{source}: larger than {MAX_BUNDLE} bytes")
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:
            part.unlink(missing_ok=True)
            raise RackbootError(f"cannot read the bundle {source}: {exc.strerror}") from None
        os.replace(part, self.path(digest.hexdigest()))
        return digest.hexdigest(), size

    def read(self, digest: str, offset: int, length: int) -> bytes:
        """A chunk for a peer (blocking)."""
        if not (isinstance(offset, int) and isinstance(length, int)) or offset < 0:
            raise RackbootError("roll.chunk needs an offset and a length")
        try:
            with open(self.path(digest), "rb") as fh:
                fh.seek(offset)
                return fh.read(max(0, min(length, CHUNK)))
        except FileNotFoundError:
            raise RackbootError(f"this appliance has no bundle {digest[:12]}") from None

    async def fetch(self, digest: str, size: int, sources: list[str], call: Call) -> Path:
        """The bundle, from the first source that has it whole and right."""
        path = self.path(digest)
        if self.has(digest, size):
            return path
        if not 0 < size <= MAX_BUNDLE:
            raise RackbootError(f"a bundle of {size} bytes")
        errors = []
        for source in sources:
            try:
                await self._pull(digest, size, source, call)
                return path
            except RackbootError as exc:
                errors.append(f"{source}: {exc}")
        raise RackbootError("could not fetch the bundle: " + "; ".join(errors or ["no source"]))

    async def _pull(self, digest: str, size: int, source: str, call: Call) -> None:
        await trio.to_thread.run_sync(lambda: self.directory.mkdir(mode=0o700, parents=True,
                                                                   exist_ok=True))  # fmt: skip
        part = self.directory / f"{digest}.part"
        hasher = hashlib.sha256()
        with open(part, "wb") as out:
            offset = 0
            while offset < size:
                data = await call(source, "roll.chunk",
                                  {"bundle": digest, "offset": offset, "length": CHUNK})  # fmt: skip
                if not isinstance(data, bytes) or not data or offset + len(data) > size:
                    raise RackbootError(f"a bad chunk at offset {offset}")
                hasher.update(data)
                await trio.to_thread.run_sync(out.write, data)
                offset += len(data)
            await trio.to_thread.run_sync(os.fsync, out.fileno())
        if hasher.hexdigest() != digest:
            part.unlink(missing_ok=True)
            raise RackbootError("the bundle fetched does not match its digest")
        os.replace(part, self.path(digest))
