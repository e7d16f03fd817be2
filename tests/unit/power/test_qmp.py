"""QMP for the qemu_power plugin: the commands each action needs from each run state,
and what QEMU's side of the socket may send (untrusted)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.power.qmp import (
    MAX_MESSAGE,
    QmpError,
    Reader,
    plan,
    reply_untrusted,
    status_untrusted,
)


@pytest.mark.parametrize(("action", "status", "commands"), [
    ("on", "prelaunch", ["cont"]),  # started with -S: never ran, nothing to reset
    ("on", "running", []),
    ("on", "shutdown", ["system_reset", "cont"]),  # its guest powered off (-no-shutdown)
    ("on", "paused", ["system_reset", "cont"]),  # powered off by us: boot, do not resume
    ("off", "running", ["stop", "system_reset"]),
    ("off", "shutdown", ["stop", "system_reset"]),
    ("off", "prelaunch", []),
    ("cycle", "running", ["system_reset"]),
    ("cycle", "shutdown", ["system_reset", "cont"]),
    ("cycle", "prelaunch", ["system_reset", "cont"]),
])  # fmt: skip
def test_each_action_from_each_run_state(action, status, commands):
    assert plan(action, status) == commands


def test_an_unknown_action_is_refused():
    with pytest.raises(ValueError, match="reboot"):
        plan("reboot", "running")


def test_messages_split_across_reads_and_events_between_replies():
    reader = Reader()
    greeting = b'{"QMP": {"version": {}, "capabilities": []}}\r\n'
    assert reader.feed(greeting[:10]) == []
    assert reader.feed(greeting[10:] + b'{"event": "STOP"}\n{"ret') == [
        {"QMP": {"version": {}, "capabilities": []}}, {"event": "STOP"}]  # fmt: skip
    assert reader.feed(b'urn": {"status": "paused", "running": false}}\n') == [
        {"return": {"status": "paused", "running": False}}]  # fmt: skip


def test_replies_errors_and_run_states():
    assert (
        status_untrusted(reply_untrusted({"return": {"status": "running"}}, "query-status"))
        == "running"
    )
    with pytest.raises(QmpError, match="cont: no VM") as caught:
        reply_untrusted({"error": {"class": "GenericError", "desc": "no VM"}}, "cont")
    assert caught.value.reason == "refused"
    for bad in ({}, {"return": []}, {"return": {"status": 7}}, {"return": {"status": "x" * 40}}):
        with pytest.raises(QmpError):
            status_untrusted(reply_untrusted(bad, "query-status"))


def test_a_flood_without_newline_is_cut_at_the_cap():
    reader = Reader()
    with pytest.raises(QmpError, match="longer"):
        for _ in range(MAX_MESSAGE // 4096 + 2):
            reader.feed(b"x" * 4096)


@given(st.binary(max_size=300))
def test_any_bytes_give_messages_or_a_protocol_error(data):
    try:
        for message in Reader().feed(data + b"\n"):
            assert isinstance(message, dict)
    except QmpError as exc:
        assert exc.reason == "protocol"


def test_non_object_json_is_refused():
    with pytest.raises(QmpError, match="not a JSON object"):
        Reader().feed(json.dumps([1, 2]).encode() + b"\n")


def test_deeply_nested_json_is_a_protocol_error_not_a_crash():
    with pytest.raises(QmpError, match="not JSON"):
        Reader().feed(b"[" * 60_000 + b"\n")
