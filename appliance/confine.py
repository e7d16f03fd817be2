"""Confine client-requested names to a served root (filesystem only, no network, no clock).

TFTP and HTTP serve boot files under the same rules; each protocol maps the two
refusals (:class:`Denied`, :class:`NotFound`) onto its own error codes.

* :class:`Denied`: NUL bytes, empty names, backslashes (a Windows client's
  ``boot\\pxe.0`` is refused rather than guessed at), any ``..`` component.
  A name is taken literally: ``%2e%2e`` is a file name here (HTTP decodes its
  targets before asking, see plugins/httpboot/urlpath.py).
* A leading ``/`` is relative to the root, as with tftpd-hpa ``-s``: PXE ROMs ask
  for ``/pxelinux.0``.
* Symlinks are resolved: a target inside the root is served, one outside it
  :class:`Denied`. Non-regular files (directories, devices, FIFOs) are
  :class:`Denied`; a name that does not exist is :class:`NotFound`.
* Any filesystem error while resolving (a symlink swapped or removed under
  the resolver) is one of the two as well, never an exception of its own: a
  request always gets an answer.

Refusals carry only what the client asked for, never the server's root path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO


class Refused(Exception):
    """``requested`` names nothing that may be served; ``str()`` quotes only the request."""

    reason = "refused"

    def __init__(self, requested: str) -> None:
        super().__init__(f"{requested}: {self.reason}")
        self.requested = requested


class Denied(Refused):
    """Outside the root, not a regular file, or a name that is never valid."""

    reason = "access violation"


class NotFound(Refused):
    """Nothing by that name under the root."""

    reason = "file not found"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _realpath(path: str | Path, requested: str) -> str:
    """``os.path.realpath``, its filesystem errors turned into refusals.

    Non-strict realpath still calls readlink() on what lstat() just saw as a
    symlink: a link swapped or removed in between (``ln -sfn``, a sync tool)
    raises EINVAL or ENOENT. Such a request must get an answer, not an exception.
    """
    try:
        return os.path.realpath(path)
    except (FileNotFoundError, NotADirectoryError):
        raise NotFound(requested) from None
    except OSError:
        raise Denied(requested) from None


def resolve_untrusted(root: Path, requested: str) -> Path:
    """The real path of the regular file ``requested`` names under ``root``, or :class:`Refused`."""
    if not requested or "\0" in requested or "\\" in requested:
        raise Denied(requested)
    relative = requested.lstrip("/")
    parts = relative.split("/")
    if not relative or ".." in parts:
        raise Denied(requested)
    real_root = _realpath(root, requested)
    real = _realpath(os.path.join(real_root, relative), requested)
    if not _inside(real, real_root) or real == real_root:
        raise Denied(requested)
    try:
        mode = os.stat(real).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise NotFound(requested) from None
    except OSError:
        raise Denied(requested) from None
    if not stat.S_ISREG(mode):
        raise Denied(requested)
    return Path(real)


def open_confined(root: Path, requested: str) -> tuple[BinaryIO, os.stat_result]:
    """Open ``requested`` read-only under ``root``; returns the unbuffered file and its ``fstat``.

    The resolved path has no symlinks left, so O_NOFOLLOW refuses a final component
    swapped for a symlink after resolution; O_NONBLOCK keeps a FIFO swapped in from
    blocking the open. A swapped directory is caught by checking where the open
    descriptor really points (/proc/self/fd), and fstat re-checks the file type.
    """
    path = resolve_untrusted(root, requested)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        raise NotFound(requested) from None
    except OSError:
        raise Denied(requested) from None
    try:
        st = os.fstat(fd)
        try:
            actual = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            actual = str(path)  # no /proc: O_NOFOLLOW and the resolution above must do
        if not stat.S_ISREG(st.st_mode) or not _inside(actual, _realpath(root, requested)):
            raise Denied(requested)
        return os.fdopen(fd, "rb", buffering=0), st
    except BaseException:
        os.close(fd)
        raise
