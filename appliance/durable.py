"""Making a rename or a new file survive a power cut: the directory that holds it is
fsynced too (Linux keeps the entry only in memory until then). Standard library only,
so the CLI's commands can use it without importing trio."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
