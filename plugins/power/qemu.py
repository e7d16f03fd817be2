"""The ``qemu_power`` plugin: power for the tests' and labs' QEMU VMs through QMP.

A machine whose ``power`` address is ``qemu:NAME`` is the VM whose QMP socket is
``[qemu_power] sockets``/``NAME``.qmp (QEMU started with ``-S -no-shutdown -qmp
unix:PATH,server=on,wait=off``; docs/power.md). Other machines are not its own
(None). No directory configured, the default: it answers for no machine at all.
The conversation is :mod:`plugins.power.qmp`'s; this module only moves its bytes,
blocking (the hook runs in a worker thread) and bounded by ``timeout``.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from appliance.api import Field, Float, Section, Service, Str, hookimpl
from appliance.config import Config
from appliance.logs import get_logger

from .address import split_address
from .qmp import ACTIONS, QmpError, Reader, command, plan, reply_untrusted, status_untrusted

if TYPE_CHECKING:
    from appliance.node import Node

log = get_logger("qemu_power")

SCHEME = "qemu"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_MESSAGES = 64  # events QEMU may interleave before a reply, at most

SECTION = Section(
    "qemu_power",
    doc="Power for QEMU VMs through their QMP sockets ('qemu:NAME' addresses; docs/power.md).",
    fields={
        "sockets": Field(
            Str(r"(/\S{0,4000})?", "an absolute directory path or ''"),
            default="",
            doc="Directory of the VMs' QMP sockets, NAME.qmp ('': no VM is powered).",
        ),  # fmt: skip
        "timeout": Field(
            Float(min=0.1, max=60.0), default=5.0, doc="Seconds one power action may take."
        ),  # fmt: skip
    },
)


class QemuPowerPlugin:
    def __init__(self) -> None:
        self.sockets: Path | None = None
        self.timeout = 5.0
        self.failures: Counter | None = None

    @hookimpl
    def rackboot_config_schema(self):
        return SECTION

    @hookimpl
    def rackboot_configure(self, config: Config) -> None:
        settings = config["qemu_power"]
        self.sockets = Path(settings.sockets) if settings.sockets else None
        self.timeout = settings.timeout

    @hookimpl
    def rackboot_services(self, node: Node) -> list[Service]:
        self.failures = Counter("rackboot_qemu_power_failures",
                                "Failed power actions on QEMU VMs, by reason", ["reason"],
                                registry=node.metrics)  # fmt: skip
        return []

    @hookimpl(optionalhook=True)  # a hook of the provisioning plugin, if it is enabled
    def provisioning_power(self, machine: Any, action: str) -> bool | None:
        scheme, name = split_address(machine.power)
        if scheme != SCHEME or self.sockets is None:
            return None
        try:
            if not NAME.fullmatch(name):
                raise QmpError("address", f"not a VM name: {name[:80]!r}")
            if action not in ACTIONS:
                raise QmpError("action", f"unknown action {action!r}")
            was, sent = converse(self.sockets / f"{name}.qmp", action, self.timeout)
        except QmpError as exc:
            log.error("power action failed", machine=machine.name, action=action,
                      reason=exc.reason, detail=str(exc))  # fmt: skip
            if self.failures is not None:
                self.failures.labels(exc.reason).inc()
            return False
        log.info("power action taken", machine=machine.name, action=action, vm=name,
                 was=was, sent=",".join(sent) or "nothing")  # fmt: skip
        return True


def converse(path: Path, action: str, timeout: float) -> tuple[str, list[str]]:
    """Take ``action`` on the VM at ``path``: its run state before, the commands sent."""
    deadline = time.monotonic() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            link = _Link(sock, deadline)
            if "QMP" not in link.next_message():
                raise QmpError("protocol", "no QMP greeting")
            link.ask("qmp_capabilities")
            was = status_untrusted(link.ask("query-status"))
            sent = plan(action, was)
            for name in sent:
                link.ask(name)
            return was, sent
    except TimeoutError:
        raise QmpError("timeout", f"no answer within {timeout:g} s") from None
    except OSError as exc:
        raise QmpError("unreachable", f"{path}: {exc.strerror or exc}") from None


class _Link:
    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self.reader = Reader()
        self.pending: list[dict[str, Any]] = []
        self.read = 0

    def next_message(self) -> dict[str, Any]:
        while not self.pending:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            data = self.sock.recv(4096)
            if not data:
                raise QmpError("protocol", "QEMU closed the connection")
            self.pending.extend(self.reader.feed(data))
        self.read += 1
        if self.read > MAX_MESSAGES:
            raise QmpError("protocol", f"no reply among {MAX_MESSAGES} messages")
        return self.pending.pop(0)

    def ask(self, name: str) -> Any:
        self.sock.sendall(command(name))
        while True:
            message = self.next_message()
            if "event" not in message:  # events may come before the reply
                return reply_untrusted(message, name)


plugin = QemuPowerPlugin()
