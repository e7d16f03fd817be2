"""systemd's readiness protocol (sd_notify(3)) without libsystemd: one datagram to
the socket ``$NOTIFY_SOCKET`` names. A unit of ``Type=notify`` is started once the
node says ``READY=1`` (every service bound and serving), so ``systemctl start``
and units ordered after it wait for a node that answers, not for a process that
exists. Nothing happens when systemd did not start us (the variable is unset)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from appliance.logs import get_logger

log = get_logger("node")


def notify(state: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Send ``state`` (``READY=1``, ``STOPPING=1``, ``STATUS=...``, newline-separated);
    False when there is no systemd to tell or it could not be told (logged)."""
    path = environ.get("NOTIFY_SOCKET", "")
    if path.startswith("@"):  # the abstract namespace
        address = "\0" + path[1:]
    elif path.startswith("/"):
        address = path
    else:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(address)
            sock.sendall(state.encode())
        except OSError as exc:
            log.warning("cannot notify systemd", socket=path, error=str(exc))
            return False
    return True
