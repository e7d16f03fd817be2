"""The etcd backend's trio shell: drives :class:`~appliance.ha.etcd_lease.EtcdLease`
with HTTP/1.1 POSTs (h11) to etcd's v3 JSON gateway, one request at a time.

The leader key is ``[ha] etcd_prefix`` + the rack name; its value is the node
name. Endpoints are tried in turn: one that fails or times out (a round,
``renew`` seconds) is left for the next.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import h11
import trio

from appliance.ha.etcd_lease import EtcdLease, Request
from appliance.logs import get_logger

log = get_logger("ha")

MAX_RESPONSE = 1024 * 1024


async def post_json(host: str, port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One POST on a fresh connection; the parsed JSON answer. Raises OSError or ValueError."""
    data = json.dumps(body).encode()
    conn = h11.Connection(h11.CLIENT)
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        headers = [("Host", f"{host}:{port}"), ("Content-Type", "application/json"),
                   ("Content-Length", str(len(data))), ("Connection", "close")]  # fmt: skip
        await stream.send_all(
            conn.send(h11.Request(method="POST", target=path, headers=headers))
            + conn.send(h11.Data(data=data))
            + conn.send(h11.EndOfMessage())
        )
        status, chunks, size = 0, [], 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_RESPONSE:
                    raise ValueError(f"etcd answer larger than {MAX_RESPONSE} bytes")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
    if status != 200:
        raise ValueError(f"etcd answered HTTP {status} to {path}")
    answer = json.loads(b"".join(chunks))
    if not isinstance(answer, dict):
        raise ValueError(f"etcd answered {type(answer).__name__}, not an object")
    return answer


class EtcdElection:
    def __init__(self, service: Any, settings: Any) -> None:
        self.service = service
        node = service.node
        self.endpoints = [urlsplit(url) for url in settings.etcd_endpoints]
        self.current = 0
        key = f"{settings.etcd_prefix}{node.config.node.rack}"
        self.machine = EtcdLease(
            node.config.node.name, key, service.timing, trio.current_time(),
            maintenance=settings.maintenance,
        )  # fmt: skip
        self._poke = trio.Event()

    @property
    def maintenance(self) -> bool:
        return self.machine.maintenance

    def poke(self) -> None:
        self._poke.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        log.info("election on etcd", key=self.machine.key, endpoints=len(self.endpoints))
        task_status.started()
        try:
            while True:
                self._events()
                deadline = self.machine.get_timer()
                self._poke = trio.Event()
                with trio.move_on_at(float("inf") if deadline is None else deadline):
                    await self._poke.wait()
                now = trio.current_time()
                self.machine.handle_timer(now)
                self._events()
                request = self.machine.next_request(now)
                if request is not None:
                    self.machine.on_response(await self._send(request), trio.current_time())
        finally:
            self.machine.in_flight = None  # cancelled mid-request: it never completed
            self.machine.release(trio.current_time(), "released")
            self._events()
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
                request = self.machine.next_request(trio.current_time())
                if request is not None and request.kind == "revoke":
                    await self._send(request)

    async def _send(self, request: Request) -> dict[str, Any] | None:
        url = self.endpoints[self.current % len(self.endpoints)]
        with trio.move_on_after(self.service.timing.round_timeout):
            try:
                return await post_json(url.hostname or "", url.port or 2379, request.path,
                                       request.body)  # fmt: skip
            except (OSError, ValueError, h11.ProtocolError) as exc:
                log.debug("etcd request failed", endpoint=url.geturl(), error=str(exc))
        self.current += 1  # next time, the next endpoint
        return None

    def _events(self) -> None:
        while self.machine.events:
            self.service.on_event(self.machine.events.popleft())

    # -- operator (same calls as the embedded election) -----------------------------

    def promote(self, now: float, *, force: bool = False) -> None:
        self.machine.promote(now, force=force)

    def demote(self, now: float) -> None:
        self.machine.demote(now)
        self._events()

    def set_maintenance(self, on: bool, now: float) -> None:
        self.machine.set_maintenance(on, now)
        self._events()

    def status(self, now: float) -> dict[str, Any]:
        return {**self.machine.status(now), "endpoint": self.endpoints[0].geturl()}
