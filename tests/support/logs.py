"""The node's log lines (JSON, as ``--log-format json`` writes them), captured for a test."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

from appliance.logs import ROOT, setup_logging


@contextlib.contextmanager
def captured_logs() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Yields a function returning the lines logged so far, parsed."""
    root = logging.getLogger(ROOT)
    saved = root.handlers[:], root.level, root.propagate
    stream = io.StringIO()
    setup_logging("json", "debug", stream)
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        handlers, root.level, root.propagate = saved
        for handler in handlers:
            root.addHandler(handler)
