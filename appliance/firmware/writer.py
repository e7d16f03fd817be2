"""The slot writer: a bundle's payloads onto the inactive slot, then read back.

The root image goes onto the slot's partition (a block device, or a plain
file in tests) in 1 MiB writes, then fsync; the kernel and initrd go to the
slot's directory on the ESP (``rackboot/SLOT/``), each through a temporary
file, fsync and rename. Verifying drops the written range from the page cache
(``POSIX_FADV_DONTNEED`` after the fsync) so that the SHA-256 is of what the
disk gives back, not of the memory that was just written, then compares every
payload with the signed manifest. Only then is the slot's version noted, and
only then may the slot be promoted (appliance/firmware/slots.py).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO

from appliance.firmware.bootstate import fsync_directory, replace_file
from appliance.firmware.bundle import CHUNK, Bundle, Payload, hash_stream

BOOT_FILES = {"kernel": "vmlinuz", "initrd": "initrd.img"}  # payload -> name on the ESP
VERSION_FILE = "version"


class WriteError(RuntimeError):
    """The slot could not be written or does not read back as signed."""


def boot_dir(esp: Path, slot: str) -> Path:
    return Path(esp) / "rackboot" / slot


def slot_version(esp: Path, slot: str) -> str | None:
    """The version noted once the slot was verified (None: unknown, or being written)."""
    try:
        with open(boot_dir(esp, slot) / VERSION_FILE, "rb") as fh:
            return fh.read(64).decode("ascii", "replace").strip() or None
    except OSError:
        return None


def write_slot(source: BinaryIO, bundle: Bundle, device: Path, esp: Path, slot: str) -> None:
    """Copy every payload of ``bundle`` (read from ``source``, the bundle file)
    to its place. The slot's version note is removed first: its content is
    unknown from now until :func:`verify_slot` succeeds."""
    directory = boot_dir(esp, slot)
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / VERSION_FILE)
    fsync_directory(directory)
    for payload in bundle.manifest.payloads:
        source.seek(bundle.offsets[payload.name])
        if payload.name == "rootfs":
            _write_device(source, payload, device)
        else:
            _write_boot_file(source, payload, directory / BOOT_FILES[payload.name])


def verify_slot(bundle: Bundle, device: Path, esp: Path, slot: str) -> None:
    """Re-read everything :func:`write_slot` wrote and compare it with the
    manifest; note the slot's version when all of it matches."""
    directory = boot_dir(esp, slot)
    for payload in bundle.manifest.payloads:
        path = device if payload.name == "rootfs" else directory / BOOT_FILES[payload.name]
        with open(path, "rb") as fh:
            with contextlib.suppress(OSError):  # not every file system drops its cache
                os.posix_fadvise(fh.fileno(), 0, payload.size, os.POSIX_FADV_DONTNEED)
            if hash_stream(fh, payload.size) != payload.sha256:
                raise WriteError(f"{path} does not read back as the bundle's {payload.name} "
                                 "(SHA-256 differs): the slot stays marked bad")  # fmt: skip
    replace_file(directory / VERSION_FILE, bundle.manifest.version.encode() + b"\n")


def _write_device(source: BinaryIO, payload: Payload, device: Path) -> None:
    try:
        fd = os.open(device, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise WriteError(f"slot partition {device}: {exc.strerror}") from None
    try:
        capacity = os.lseek(fd, 0, os.SEEK_END)
        if os.path.isfile(device):
            capacity = max(capacity, payload.size)  # a plain file stands in for a partition
        if capacity < payload.size:
            raise WriteError(f"slot partition {device} holds {capacity} bytes, the image "
                             f"{payload.size}")  # fmt: skip
        os.lseek(fd, 0, os.SEEK_SET)
        _copy(source, fd, payload)
        os.fsync(fd)
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, payload.size, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _write_boot_file(source: BinaryIO, payload: Payload, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        _copy(source, fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_directory(path.parent)


def _copy(source: BinaryIO, fd: int, payload: Payload) -> None:
    left = payload.size
    for _ in range(payload.size // CHUNK + 1):
        if left == 0:
            return
        chunk = source.read(min(CHUNK, left))
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]
        left -= len(chunk)
    if left:
        raise WriteError(f"the bundle ended {left} bytes into payload {payload.name}")
