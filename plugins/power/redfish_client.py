"""The blocking shell of the Redfish power plugin: one action, one BMC, at most two requests
(read the system, post its reset) on one connection, all within ``timeout`` seconds.

Runs in the provisioning workflow's worker thread, so the standard library's blocking
HTTP client does. Replies are read up to REPLY_CAP bytes and parsed by the ``*_untrusted``
functions of plugins/power/redfish_core.py.
"""

from __future__ import annotations

import base64
import http.client
import ssl
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
    """Take ``action`` on the system at ``target`` through ``bmc``; PowerError if it failed."""
    deadline = time.monotonic() + timeout
    conn: http.client.HTTPConnection
    if target.tls:
        conn = http.client.HTTPSConnection(target.connect_host, target.port, timeout=timeout,
                                           context=bmc.tls)  # fmt: skip
    elif bmc.plain_http:
        conn = http.client.HTTPConnection(target.connect_host, target.port, timeout=timeout)
    else:
        raise PowerError("plain_http", f"a redfish+http address, but BMC {bmc.address} "
                         "does not allow plain HTTP (plain_http = false)")  # fmt: skip
    credentials = base64.b64encode(f"{bmc.username}:{bmc.password}".encode()).decode()
    headers = {"Authorization": f"Basic {credentials}", "Accept": "application/json",
               "OData-Version": "4.0"}  # fmt: skip
    try:
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
    except ssl.SSLCertVerificationError as exc:
        raise PowerError(
            "tls", f"the BMC's certificate is not trusted: {exc.verify_message}"
        ) from None
    except ssl.SSLError as exc:
        raise PowerError("tls", f"TLS failed: {exc.reason or exc}") from None
    except TimeoutError:
        raise PowerError("timeout", f"no answer within {timeout:g} s") from None
    except OSError as exc:
        raise PowerError("unreachable", f"cannot reach the BMC: {exc.strerror or exc}") from None
    except http.client.HTTPException as exc:
        raise PowerError("bad_reply", f"not HTTP: {type(exc).__name__}") from None
    except ReplyError as exc:
        raise PowerError("bad_reply", f"the system's resource: {exc}") from None
    except PlanError as exc:
        raise PowerError("no_reset_type", str(exc)) from None
    finally:
        conn.close()


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
        chunk = response.read(READ_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > REPLY_CAP:
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
