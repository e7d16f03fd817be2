"""QMP, QEMU's machine protocol, for the ``qemu_power`` plugin (sans-IO).

A power action on a test VM is a short conversation over its QMP socket: the
greeting, ``qmp_capabilities``, ``query-status``, then the commands :func:`plan`
picks for the action and the VM's run state. The VMs run with ``-S -no-shutdown``:
started paused (powered off until ``on``), and a guest that powers itself off stays
a QEMU process in state ``shutdown`` instead of exiting, so it can be powered on
again. Messages are JSON objects, one per line; :class:`Reader` splits and checks
what the socket returns (untrusted: capped, and only objects).
"""

from __future__ import annotations

import json
from typing import Any

MAX_MESSAGE = 64 * 1024  # a reply of query-status is ~100 bytes; events are small too
ACTIONS = ("on", "off", "cycle")
# Run states (QAPI RunState) of a VM that is not executing its guest.
STOPPED = frozenset({"prelaunch", "paused", "shutdown", "suspended", "debug", "watchdog",
                     "guest-panicked", "io-error", "postmigrate", "finish-migrate",
                     "restore-vm", "save-vm", "colo", "inmigrate"})  # fmt: skip


class QmpError(Exception):
    """The conversation went wrong: ``reason`` is a metric label, the text the detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def plan(action: str, status: str) -> list[str]:
    """The commands that take a VM in run state ``status`` to the result of ``action``.

    ``on``: a running VM is left alone; a powered-off one (reset first when its guest
    shut down or ran, so that it boots) is continued. ``off``: stopped, then reset, so
    that the next ``on`` boots it from its firmware rather than resuming it. ``cycle``:
    reset, and continued if it was not running.
    """
    if action not in ACTIONS:
        raise ValueError(f"unknown power action {action!r}")
    running = status not in STOPPED
    if action == "on":
        if running:
            return []
        return ["cont"] if status == "prelaunch" else ["system_reset", "cont"]
    if action == "off":
        return [] if status == "prelaunch" else ["stop", "system_reset"]
    return ["system_reset"] if running else ["system_reset", "cont"]


def command(name: str) -> bytes:
    return json.dumps({"execute": name}).encode() + b"\n"


class Reader:
    """Bytes in, QMP messages out: the greeting, replies (``return``/``error``), events."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > MAX_MESSAGE:
            raise QmpError("protocol", f"a message longer than {MAX_MESSAGE} bytes")
        return [message_untrusted(line) for line in lines if line.strip()]


def message_untrusted(line: bytes) -> dict[str, Any]:
    """One QMP message; QmpError("protocol") for anything that is not a JSON object."""
    if len(line) > MAX_MESSAGE:
        raise QmpError("protocol", f"a message longer than {MAX_MESSAGE} bytes")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nested deep
        raise QmpError("protocol", f"not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise QmpError("protocol", "a message that is not a JSON object")
    return message


def reply_untrusted(message: dict[str, Any], asked: str) -> Any:
    """The ``return`` of a reply to ``asked``; QmpError("refused") for an ``error``."""
    if "error" in message:
        error = message["error"]
        desc = error.get("desc") if isinstance(error, dict) else None
        raise QmpError("refused", f"{asked}: {str(desc)[:200] if desc else 'error'}")
    if "return" not in message:
        raise QmpError("protocol", f"{asked}: a reply without 'return'")
    return message["return"]


def status_untrusted(value: Any) -> str:
    """The run state of a ``query-status`` return."""
    status = value.get("status") if isinstance(value, dict) else None
    if not isinstance(status, str) or not 0 < len(status) <= 32:
        raise QmpError("protocol", "query-status without a run state")
    return status
