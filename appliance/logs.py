"""Structured logs on stderr: ``key=value`` by default, JSON lines with ``--log-format json``.

log = get_logger("node")
log.info("ready", services=3, role="active")
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

from appliance.jsontext import dumps

ROOT = "rackboot"
_RESERVED = ("ts", "level", "logger", "msg")


class Logger:
    """A thin wrapper over :mod:`logging` that takes fields as keyword arguments."""

    __slots__ = ("_log",)

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(f"{ROOT}.{name}" if name else ROOT)

    def _emit(self, level: int, msg: str, fields: dict[str, Any]) -> None:
        log = self._log
        if log.isEnabledFor(level):
            # The record made directly: Logger.log would look up the caller's frame
            # (~10 µs; no formatter here prints it), a cost on every access-log line.
            log.handle(log.makeRecord(log.name, level, "", 0, msg, (), None,
                                      extra={"fields": fields}))  # fmt: skip

    def debug(self, msg: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, msg, fields)

    def info(self, msg: str, **fields: Any) -> None:
        self._emit(logging.INFO, msg, fields)

    def warning(self, msg: str, **fields: Any) -> None:
        self._emit(logging.WARNING, msg, fields)

    def error(self, msg: str, **fields: Any) -> None:
        self._emit(logging.ERROR, msg, fields)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 (mirrors logging)
        return self._log.isEnabledFor(level)


def get_logger(name: str) -> Logger:
    return Logger(name)


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    out = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in getattr(record, "fields", {}).items():
        out[f"{key}_" if key in _RESERVED else key] = value
    if record.exc_info and record.exc_info[1] is not None:
        out["error"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
    return out


_NEEDS_QUOTES = re.compile(r'[ "=\\\n\t]')


def _kv_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif type(value) is int:  # exactly: bool and IntEnum go through dumps, as JSON says them
        text = int.__repr__(value)
    else:
        text = dumps(value, separators=(",", ":"))
    return json.dumps(text) if not text or _NEEDS_QUOTES.search(text) else text


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_kv_value(v)}" for k, v in _record_fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return dumps(_record_fields(record), separators=(",", ":"))


def setup_logging(fmt: str = "kv", level: str = "info", stream=None) -> None:
    """Configure the ``rackboot`` logger tree; idempotent."""
    root = logging.getLogger(ROOT)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
