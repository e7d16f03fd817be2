"""An HTTP client for plugin tests (the ``httpboot`` driver of :mod:`appliance.testing`).

Requests to a test node's HTTP server over loopback with the standard library's
``http.client``, from any loopback address (``source``): a machine's script and
events are served only to the address of its DHCP lease (127.0.100.x on the
development node). Blocking, each request bounded.

    ack = node.dhcp.dora(MAC)
    boot = node.http.script(MAC, source=str(ack.yiaddr))  # its token and events URL
    node.http.event(boot, "install", "ok")                # httpboot_machine_event fires
"""

from __future__ import annotations

import http.client
import json
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .identity import url_mac

TIMEOUT = 10.0  # seconds for one request
UNAVAILABLE_FOR = 10.0  # seconds a 503 (no token secret yet, just started) is asked again
RETRY_AFTER = 0.05


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class BootScript:
    """A machine's iPXE script, with what its installer needs to report back."""

    text: str
    token: str
    events_url: str
    source: str  # the address it was fetched from (its events must come from there too)


class HttpClient:
    def __init__(self, node: Any, timeout: float = TIMEOUT) -> None:
        self.host, self.port = node.listening("httpboot")
        self.timeout = timeout

    def request(self, method: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None, source: str | None = None) -> Reply:  # fmt: skip
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout,
                                          source_address=(source, 0) if source else None)  # fmt: skip
        try:
            conn.request(method, path, body=body or None, headers=headers or {})
            response = conn.getresponse()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                         response.read())  # fmt: skip
        finally:
            conn.close()

    def get(self, path: str, source: str | None = None) -> Reply:
        return self.request("GET", path, source=source)

    def script(self, mac: str, source: str) -> BootScript:
        """GET /boot/MAC.ipxe from ``source`` (asked again while the node answers 503:
        a node just started has no token secret yet)."""
        deadline = time.monotonic() + UNAVAILABLE_FOR
        while True:
            reply = self.get(f"/boot/{url_mac(mac)}.ipxe", source=source)
            if reply.status != 503 or time.monotonic() > deadline:
                break
            time.sleep(RETRY_AFTER)
        if reply.status != 200:
            raise AssertionError(f"script of {mac}: HTTP {reply.status} {reply.body[:200]!r}")
        text = reply.body.decode()
        token = re.search(r"rackboot\.token=(\S+)", text)
        events = re.search(r"rackboot\.events=(\S+)", text)
        if token is None or events is None:
            raise AssertionError(f"script of {mac} has no rackboot.token/events:\n{text}")
        return BootScript(text, token[1], events[1], source)

    def event(self, boot: BootScript, stage: str, status: str, message: str = "") -> Reply:
        """POST an installer's event as the machine that fetched ``boot``."""
        body = json.dumps({"stage": stage, "status": status, "message": message}).encode()
        headers = {"authorization": f"Bearer {boot.token}", "content-type": "application/json"}
        return self.request("POST", urlsplit(boot.events_url).path, body, headers, boot.source)
