"""TFTP's view of the shared path confinement (appliance/confine.py): the same
rules as HTTP boot, refusals turned into TFTP errors.

A name that does not exist is ERROR 1 (file not found); every other refusal
(NUL, backslash, ``..``, a symlink leaving the root, a directory or device) is
ERROR 2 (access violation). Messages quote only what the client asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from appliance import confine

from .packets import ErrorCode


class Refused(Exception):
    """A request the server refuses: ``code`` and ``message`` go to the client as an ERROR."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


def _as_tftp(refusal: confine.Refused) -> Refused:
    missing = isinstance(refusal, confine.NotFound)
    return Refused(
        ErrorCode.FILE_NOT_FOUND if missing else ErrorCode.ACCESS_VIOLATION, str(refusal)
    )


def resolve_untrusted(root: Path, requested: str) -> Path:
    """The real path of the regular file ``requested`` names under ``root``, or :class:`Refused`."""
    try:
        return confine.resolve_untrusted(root, requested)
    except confine.Refused as refusal:
        raise _as_tftp(refusal) from None


def open_confined(root: Path, requested: str) -> tuple[BinaryIO, int]:
    """Open ``requested`` read-only under ``root``; returns the unbuffered file and its size."""
    try:
        handle, st = confine.open_confined(root, requested)
    except confine.Refused as refusal:
        raise _as_tftp(refusal) from None
    return handle, st.st_size
