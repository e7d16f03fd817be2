"""Structured log lines: key=value by default, one JSON object per line on request."""

from __future__ import annotations

import io
import json
import logging

import pytest

from appliance.logs import ROOT, get_logger, setup_logging


@pytest.fixture
def stream():
    buf = io.StringIO()
    yield buf
    for handler in list(logging.getLogger(ROOT).handlers):
        logging.getLogger(ROOT).removeHandler(handler)


def test_key_value_lines_quote_what_needs_quoting(stream):
    setup_logging("kv", "info", stream)
    get_logger("node").info(
        "service ready", service="dhcp.server", note='two words "q"', n=3, empty=""
    )
    line = stream.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    assert ' level=info logger=rackboot.node msg="service ready" service=dhcp.server ' in line
    assert 'note="two words \\"q\\"" n=3 empty=""' in line


def test_json_lines_and_reserved_field_names(stream):
    setup_logging("json", "debug", stream)
    get_logger("x").debug("hello", level="shadow", addr=("10.0.0.1", 67))
    record = json.loads(stream.getvalue())
    assert (
        record["level"] == "debug" and record["logger"] == "rackboot.x" and record["msg"] == "hello"
    )
    assert record["level_"] == "shadow" and record["addr"] == ["10.0.0.1", 67]
    assert record["ts"].endswith("Z")


def test_level_filters(stream):
    setup_logging("kv", "warning", stream)
    log = get_logger("y")
    log.info("hidden")
    log.warning("shown")
    assert "hidden" not in stream.getvalue() and "shown" in stream.getvalue()


def test_log_lines_are_strict_json_and_a_non_finite_number_is_null():
    """A field of inf (an endless lease) or NaN: JSON readers other than Python's refuse
    Infinity and NaN, so both formats write null."""
    from appliance.logs import JsonFormatter, KeyValueFormatter

    record = logging.LogRecord("rackboot.test", logging.INFO, __file__, 1, "lease", (), None)
    record.fields = {"until": float("inf"), "rates": [1.5, float("nan")]}
    line = JsonFormatter().format(record)
    document = json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in {line}"))
    assert document["until"] is None and document["rates"] == [1.5, None]
    text = KeyValueFormatter().format(record)
    assert "until=null" in text and "rates=[1.5,null]" in text
