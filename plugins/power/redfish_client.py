"""The blocking shell of the Redfish power plugin: one action, one BMC, at most two requests
(read the system, post its reset) on one connection, all within ``timeout`` seconds.

Runs in the provisioning workflow's worker thread, so the standard library's blocking
HTTP client does. Replies are read up to REPLY_CAP bytes and parsed by the ``*_untrusted``
functions of plugins/power/redfish_core.py.
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass

from .redfish_config import Bmc
from .redfish_core import (
    REPLY_CAP,
    PlanError,
    ReplyError,
    Target,
    error_message_untrusted,
    reset_body,
    reset_type,
    system_untrusted,
)

READ_CHUNK = 64 * 1024
RESET_ACCEPTED = (200, 202, 204)  # done, queued as a task, done with no body


class PowerError(Exception):
    """A failed action: ``reason`` is a metric label, ``detail`` a sentence for the log."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Outcome:
    reset: str | None  # the ResetType the BMC accepted; None: the machine was already there
    power_state: str | None  # the PowerState the BMC reported before


def take(bmc: Bmc, target: Target, action: str, timeout: float) -> Outcome:
    """Take ``action`` on the system at ``target`` through ``bmc``; PowerError if it failed.
    Returns or raises within about ``timeout`` seconds, whatever the BMC sends or withholds."""
    conn: http.client.HTTPConnection
    if target.tls:
        conn = http.client.HTTPSConnection(target.connect_host, target.port, timeout=timeout,
                                           context=bmc.tls)  # fmt: skip
    elif bmc.plain_http:
        conn = http.client.HTTPConnection(target.connect_host, target.port, timeout=timeout)
    else:
        raise PowerError("plain_http", f"a redfish+http address, but BMC {bmc.address} "
                         "does not allow plain HTTP (plain_http = false)")  # fmt: skip
    watchdog = _Watchdog(conn, timeout)
    try:
        return _exchange(conn, bmc, target, action, time.monotonic() + timeout)
    except (OSError, http.client.HTTPException, ReplyError) as exc:
        if watchdog.fired:  # whatever the cut connection raised: the deadline passed
            raise PowerError("timeout", f"no complete answer within {timeout:g} s") from None
        raise _failure(exc, timeout) from None
    except PlanError as exc:
        raise PowerError("no_reset_type", str(exc)) from None
    finally:
        watchdog.cancel()
        conn.close()


def _exchange(conn: http.client.HTTPConnection, bmc: Bmc, target: Target, action: str,
              deadline: float) -> Outcome:  # fmt: skip
    credentials = base64.b64encode(f"{bmc.username}:{bmc.password}".encode()).decode()
    headers = {"Authorization": f"Basic {credentials}", "Accept": "application/json",
               "OData-Version": "4.0"}  # fmt: skip
    status, body = _request(conn, "GET", target.path, None, headers, deadline)
    _expect(status, (200,), body, "reading the system")
    system = system_untrusted(body, target.path)
    reset = reset_type(action, system)
    if reset is not None:
        headers["Content-Type"] = "application/json"
        status, body = _request(conn, "POST", system.reset_target, reset_body(reset),
                                headers, deadline)  # fmt: skip
        _expect(status, RESET_ACCEPTED, body, f"posting ResetType {reset}")
    return Outcome(reset, system.power_state)


def _failure(exc: Exception, timeout: float) -> PowerError:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return PowerError("tls", f"the BMC's certificate is not trusted: {exc.verify_message}")
    if isinstance(exc, ssl.SSLError):
        return PowerError("tls", f"TLS failed: {exc.reason or exc}")
    if isinstance(exc, TimeoutError):
        return PowerError("timeout", f"no answer within {timeout:g} s")
    if isinstance(exc, OSError):
        return PowerError("unreachable", f"cannot reach the BMC: {exc.strerror or exc}")
    if isinstance(exc, http.client.HTTPException):
        return PowerError("bad_reply", f"not HTTP: {type(exc).__name__}")
    return PowerError("bad_reply", f"the system's resource: {exc}")


class _Watchdog:
    """Cuts the connection at the deadline: a BMC that trickles its headers or a TLS
    handshake byte by byte would otherwise hold the worker thread far longer, each byte
    restarting the socket's timeout."""

    def __init__(self, conn: http.client.HTTPConnection, timeout: float) -> None:
        self.conn, self.fired = conn, False
        self.timer = threading.Timer(timeout, self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once
            except OSError:
                pass

    def cancel(self) -> None:
        self.timer.cancel()


def _request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None,
             headers: dict[str, str], deadline: float) -> tuple[int, bytes]:  # fmt: skip
    _bound(conn, deadline)
    conn.request(method, path, body=body, headers=headers)
    _bound(conn, deadline)
    response = conn.getresponse()
    chunks: list[bytes] = []
    size = 0
    while True:  # bounded: REPLY_CAP bytes, and the deadline
        _bound(conn, deadline)
        chunk = response.read1(READ_CHUNK)  # what one read brings: the deadline is checked
        if not chunk:
            break
        size += len(chunk)
        if size > REPLY_CAP:
            if response.status >= 300:  # an error page: its status says enough
                break
            raise ReplyError(f"a reply of more than {REPLY_CAP} bytes")
        chunks.append(chunk)
    return response.status, b"".join(chunks)


def _bound(conn: http.client.HTTPConnection, deadline: float) -> None:
    """Each blocking call waits at most until the action's deadline."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    conn.timeout = left
    if conn.sock is not None:
        conn.sock.settimeout(left)


def _expect(status: int, accepted: tuple[int, ...], body: bytes, doing: str) -> None:
    if status in accepted:
        return
    said = error_message_untrusted(body)
    said = f": {said}" if said else ""
    if status in (401, 403):
        raise PowerError("auth", f"the BMC refused the credentials (HTTP {status}) {doing}{said}")
    if status == 404:
        raise PowerError("not_found", f"not found on the BMC (HTTP 404) {doing}{said}")
    raise PowerError("refused", f"HTTP {status} {doing}{said}")
