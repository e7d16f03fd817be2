"""Access lines written in batches (appliance.logs.LineBatch): each line is what the
logger's own handler writes for the same record, lines leave at a flush or when
``max_lines`` wait, and a tree setup_logging did not make gets each line at once."""

from __future__ import annotations

import io
import logging
import re

import pytest

from appliance.logs import ROOT, LineBatch, get_logger, setup_logging

FIELDS = [
    {"client": "10.0.0.5", "method": "GET", "target": "/boot/a b", "status": 200, "bytes": 10,
     "ms": 0.3},
    {"level": "x", "ts": "shadow", "empty": "", "quote": 'say "hi"', "none": None, "ok": True,
     "inf": float("inf"), "nan": float("nan"), "big": 1e300, "list": [1, "a"], "neg": -0.0},
]  # fmt: skip
_TS = re.compile(r'("?ts"?[=:]"?)\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z')


@pytest.fixture
def tree():
    yield
    root = logging.getLogger(ROOT)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.propagate = True


@pytest.mark.parametrize("fmt", ["kv", "json"])
@pytest.mark.parametrize("fields", FIELDS)
def test_a_batched_line_is_the_handlers_line(tree, fmt, fields):
    stream = io.StringIO()
    setup_logging(fmt, "info", stream)
    for _ in range(2):  # the second time from what the formatter keeps of the first
        get_logger("httpboot.access").info("request", **fields)
    direct = stream.getvalue()
    stream.truncate(0), stream.seek(0)
    batch = LineBatch(get_logger("httpboot.access"))
    for _ in range(2):
        batch.info("request", **fields)
    assert stream.getvalue() == ""  # not yet
    batch.flush()
    assert _TS.sub(r"\1T", stream.getvalue()) == _TS.sub(r"\1T", direct)


def test_more_strings_than_the_formatter_keeps(tree):
    stream = io.StringIO()
    setup_logging("kv", "info", stream)
    batch = LineBatch(get_logger("httpboot.access"), max_lines=10_000)
    targets = [f"/boot/{n}" + (" x" if n % 3 else "") for n in range(3000)] * 2
    for n, target in enumerate(targets):
        batch.info("request", target=target, ms=n / 10)
    batch.flush()
    for line, (n, target) in zip(stream.getvalue().splitlines(), enumerate(targets), strict=True):
        written = f'"{target}"' if " " in target else target
        assert line.endswith(f" target={written} ms={n / 10!r}")


def test_lines_leave_at_a_flush_or_when_max_lines_wait(tree):
    stream = io.StringIO()
    setup_logging("kv", "info", stream)
    first: list[int] = []
    batch = LineBatch(get_logger("httpboot.access"), on_first=lambda: first.append(1), max_lines=3)
    for n in range(2):
        batch.info("request", n=n)
    assert stream.getvalue() == "" and first == [1]
    batch.info("request", n=2)
    assert stream.getvalue().count("\n") == 3 and "n=0" in stream.getvalue()
    batch.info("request", n=3)
    assert first == [1, 1]  # a new batch began
    batch.flush()
    assert [line.rsplit("n=", 1)[1] for line in stream.getvalue().splitlines()] == list("0123")


def test_a_level_above_info_writes_nothing(tree):
    stream = io.StringIO()
    setup_logging("kv", "warning", stream)
    batch = LineBatch(get_logger("httpboot.access"))
    batch.info("request", n=1)
    batch.flush()
    assert stream.getvalue() == "" and batch.lines == []


def test_without_setup_logging_each_line_goes_through_logging(tree, caplog):
    logging.getLogger(ROOT).propagate = True
    batch = LineBatch(get_logger("httpboot.access"))
    with caplog.at_level(logging.INFO, logger=ROOT):
        batch.info("request", status=404)
    assert [r.fields for r in caplog.records if r.name == "rackboot.httpboot.access"] == [
        {"status": 404}
    ]
    assert batch.lines == []
