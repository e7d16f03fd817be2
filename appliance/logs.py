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


class _Timestamps:
    """``ts`` of a line: the date and time formatted once a second, the milliseconds
    added (as ``LogRecord.msecs`` has them)."""

    def __init__(self) -> None:
        self._second, self._text = -1, ""
        self._msecs, self._last = -1, ""  # the last line's: lines come many a millisecond

    def __call__(self, created: float) -> str:
        second = int(created)
        msecs = int((created - second) * 1000)
        if second != self._second:
            self._text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second, self._msecs = second, -1
        if msecs != self._msecs:
            self._msecs, self._last = msecs, f"{self._text}.{msecs:03d}Z"
        return self._last


_timestamp = _Timestamps()


def _line_fields(
    created: float, level: str, logger: str, msg: str, fields: dict[str, Any]
) -> dict[str, Any]:
    out = {"ts": _timestamp(created), "level": level, "logger": logger, "msg": msg}
    for key, value in fields.items():
        out[f"{key}_" if key in _RESERVED else key] = value
    return out


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    out = _line_fields(record.created, record.levelname.lower(), record.name,
                       record.getMessage(), getattr(record, "fields", {}))  # fmt: skip
    if record.exc_info and record.exc_info[1] is not None:
        out["error"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
    return out


_NEEDS_QUOTES = re.compile(r'[ "=\\\n\t]')
_KEPT_STRING, _KEPT_STRINGS = 64, 1024  # KeyValueFormatter.line's memory of written strings


def _kv_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif type(value) is int:  # exactly: bool and IntEnum go through dumps, as JSON says them
        text = int.__repr__(value)
    elif type(value) is float and value - value == 0.0:  # finite (inf, nan: dumps says null)
        text = float.__repr__(value)  # what dumps writes for a finite float
    else:
        text = dumps(value, separators=(",", ":"))
    return json.dumps(text) if not text or _NEEDS_QUOTES.search(text) else text


class KeyValueFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._heads: dict[tuple[str, str, str], str] = {}  # " level=.. logger=.. msg=.."
        # Short strings and floats as written (quoted or not): lines repeat the same few.
        self._strings: dict[str | float, str] = {}

    def format(self, record: logging.LogRecord) -> str:
        return " ".join([f"{k}={_kv_value(v)}" for k, v in _record_fields(record).items()])

    def line(
        self, created: float, level: str, logger: str, msg: str, fields: dict[str, Any]
    ) -> str:
        """What :meth:`format` makes of such a record, without one (LineBatch)."""
        key = (level, logger, msg)
        head = self._heads.get(key)
        if head is None:
            head = f" level={_kv_value(level)} logger={_kv_value(logger)} msg={_kv_value(msg)}"
            if len(self._heads) < 256:  # messages are constants in the code
                self._heads[key] = head
        parts = [f"ts={_timestamp(created)}{head}"]
        strings = self._strings
        for k, v in fields.items():
            if (type(v) is str and len(v) <= _KEPT_STRING) or type(v) is float:  # an
                # address, a method, a path, a duration: a line per request repeats them
                text = strings.get(v)
                if text is None:
                    if len(strings) >= _KEPT_STRINGS:
                        strings.clear()
                    text = strings[v] = _kv_value(v)
            else:
                text = int.__repr__(v) if type(v) is int else _kv_value(v)
            parts.append(f"{k}_={text}" if k in _RESERVED else f"{k}={text}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return dumps(_record_fields(record), separators=(",", ":"))

    def line(
        self, created: float, level: str, logger: str, msg: str, fields: dict[str, Any]
    ) -> str:
        """What :meth:`format` makes of such a record, without one (LineBatch)."""
        return dumps(_line_fields(created, level, logger, msg, fields), separators=(",", ":"))


class LineBatch:
    """Lines of one logger kept and written together: for a line per request (the HTTP
    access log), where a record, a handler's lock and a write each cost more than the
    request's own work.

    A line is formatted when it is logged (its ``ts`` is then), exactly as the handler
    :func:`setup_logging` installed formats it, and kept until :meth:`flush` (its owner
    calls it on a timer and when it stops) or until ``max_lines`` wait: one write for
    them all. ``on_first`` is called when a line starts an empty batch (to arm the
    owner's timer). When the ``rackboot`` tree is not the one :func:`setup_logging`
    made (no call yet, another handler added: a test's ``caplog``), each line goes
    through :mod:`logging` at once, as :meth:`Logger.info` sends it."""

    def __init__(self, logger: Logger, on_first=None, max_lines: int = 256) -> None:
        self.logger = logger
        self.on_first = on_first
        self.max_lines = max_lines
        self.lines: list[str] = []
        self._handler: logging.StreamHandler | None = None  # that the lines were made for

    def info(self, msg: str, **fields: Any) -> None:
        log = self.logger._log
        if not log.isEnabledFor(logging.INFO):
            return
        if not self.lines:  # the tree asked about once a batch (a flush: 0.2 s at most)
            handler = _installed_handler()
            if handler is None or not _reaches_only(log, handler):
                self.logger.info(msg, **fields)
                return
            self._handler = handler
            if self.on_first is not None:
                self.on_first()
        assert self._handler is not None
        formatter = self._handler.formatter
        assert isinstance(formatter, KeyValueFormatter | JsonFormatter)
        self.lines.append(formatter.line(time.time(), "info", log.name, msg, fields))
        if len(self.lines) >= self.max_lines:
            self.flush()

    def flush(self) -> None:
        lines, handler = self.lines, self._handler
        if not lines or handler is None:
            return
        self.lines = []
        text = "\n".join(lines) + "\n"
        handler.acquire()
        try:
            handler.stream.write(text)
            handler.flush()
        except Exception:  # as logging has it: a broken log stream never breaks the caller
            handler.handleError(logging.makeLogRecord({"msg": text}))
        finally:
            handler.release()


_installed: logging.StreamHandler | None = None  # setup_logging's, while it is in place


def _installed_handler() -> logging.StreamHandler | None:
    root = logging.getLogger(ROOT)
    if _installed is None or root.handlers != [_installed] or root.propagate:
        return None
    return _installed


def _reaches_only(log: logging.Logger, handler: logging.Handler) -> bool:
    """Whether a record of ``log`` ends in ``handler`` alone (no handler, filter or
    disabled logger below the ``rackboot`` logger, which has only ``handler``)."""
    node: logging.Logger | None = log
    while node is not None and node.name != ROOT:
        if node.handlers or node.filters or node.disabled or not node.propagate:
            return False
        node = node.parent  # type: ignore[assignment]
    return node is not None and not node.filters and not handler.filters


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
    global _installed
    _installed = handler
