"""Confine client-requested names to the served root (filesystem, not sans-IO).

Rules, each refused with ERROR 2 (access violation) unless noted:

* NUL bytes, empty names, backslashes (a Windows client's ``boot\\pxe.0`` is
  refused rather than guessed at; a remap rule can come later, as tftpd-hpa's
  ``-m``), and any ``..`` component. ``%2e%2e`` is a literal file name.
* A leading ``/`` is relative to the root, as with tftpd-hpa ``-s``: PXE ROMs ask
  for ``/pxelinux.0``.
* Symlinks are resolved: a target inside the root is served, one outside it
  refused. Non-regular files (directories, devices, FIFOs) are refused; a name
  that does not exist is ERROR 1 (file not found).

Messages quote only what the client asked for, never the server's root path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from .packets import ErrorCode


class Refused(Exception):
    """A request the server refuses: ``code`` and ``message`` go to the client as an ERROR."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_untrusted(root: Path, requested: str) -> Path:
    """The real path of the regular file ``requested`` names under ``root``, or :class:`Refused`."""
    denied = Refused(ErrorCode.ACCESS_VIOLATION, f"{requested}: access violation")
    if not requested or "\0" in requested or "\\" in requested:
        raise denied
    relative = requested.lstrip("/")
    parts = relative.split("/")
    if not relative or ".." in parts:
        raise denied
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, relative))
    if not _inside(real, real_root) or real == real_root:
        raise denied
    try:
        mode = os.stat(real).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise Refused(ErrorCode.FILE_NOT_FOUND, f"{requested}: file not found") from None
    except OSError:
        raise denied from None
    if not stat.S_ISREG(mode):
        raise denied
    return Path(real)


def open_confined(root: Path, requested: str) -> tuple[BinaryIO, int]:
    """Open ``requested`` read-only under ``root``; returns the unbuffered file and its size.

    The resolved path has no symlinks left, so O_NOFOLLOW refuses a final component
    swapped for a symlink after resolution; O_NONBLOCK keeps a FIFO swapped in from
    blocking the open. A swapped directory is caught by checking where the open
    descriptor really points (/proc/self/fd), and fstat re-checks the file type.
    """
    path = resolve_untrusted(root, requested)
    denied = Refused(ErrorCode.ACCESS_VIOLATION, f"{requested}: access violation")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        raise Refused(ErrorCode.FILE_NOT_FOUND, f"{requested}: file not found") from None
    except OSError:
        raise denied from None
    try:
        st = os.fstat(fd)
        try:
            actual = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            actual = str(path)  # no /proc: O_NOFOLLOW and the resolution above must do
        if not stat.S_ISREG(st.st_mode) or not _inside(actual, os.path.realpath(root)):
            raise denied
        return os.fdopen(fd, "rb", buffering=0), st.st_size
    except BaseException:
        os.close(fd)
        raise
