"""The peer transport's trio shell: TLS 1.3 contexts, the session pump, enrolment I/O.

Peer links are mutually authenticated TLS 1.3: both ends present a node
certificate and verify the other's against the cluster CA; then the
certificate is checked again on its exact bytes for what TLS does not know
(a node URI of *our* cluster, not revoked). Only enrolment runs without a
client certificate: the joining node authenticates the server by the CA
fingerprint its token pins, and proves the token inside that channel.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ssl
import time
from collections.abc import Callable
from typing import Any

import trio

from appliance.cluster import pki, wire
from appliance.cluster.files import Identity
from appliance.cluster.session import Event, Session
from appliance.logs import get_logger

log = get_logger("cluster")

ENROL_TIMEOUT = 5.0  # per member address; the control socket gives a request 10 s


def server_context(identity: Identity) -> ssl.SSLContext:
    """Accepts members (client certificate verified) and joining nodes (no certificate)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(identity.cert_path, identity.key_path)
    ctx.load_verify_locations(cadata=identity.ca_pem)
    ctx.verify_mode = ssl.CERT_OPTIONAL  # no certificate: only enrolment is possible
    return ctx


def client_context(identity: Identity) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # members are named by the node URI in their certificate
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=identity.ca_pem)
    ctx.load_cert_chain(identity.cert_path, identity.key_path)
    return ctx


def enrol_context() -> ssl.SSLContext:
    """The joining node's context: the server is checked by the pinned CA fingerprint afterwards."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def utcnow() -> dt.datetime:
    return pki.utc(time.time())


def tls_reason(exc: BaseException) -> str:
    """The most specific reason in an exception chain (trio wraps ssl errors)."""
    seen = exc
    for _ in range(16):
        if isinstance(seen, BaseExceptionGroup) and seen.exceptions:
            seen = seen.exceptions[0]
        elif seen.__cause__ is not None or seen.__context__ is not None:
            seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
        else:
            break
    if isinstance(seen, ssl.SSLCertVerificationError):
        return f"{seen.reason}: {seen.verify_message}"
    if isinstance(seen, ssl.SSLError):
        return seen.reason or str(seen)
    if isinstance(seen, OSError) and seen.strerror:
        return seen.strerror
    return f"{type(seen).__name__}: {seen}" if str(seen) else type(seen).__name__


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


# -- simple request/response exchange (enrolment) ---------------------------


class MessageStream:
    """Whole messages over a stream, with the size cap of :class:`wire.FrameReader`."""

    def __init__(self, stream: trio.abc.Stream, max_message: int = 64 * 1024) -> None:
        self.stream = stream
        self.reader = wire.FrameReader(max_message)
        self.pending: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        await self.stream.send_all(wire.encode(message))

    async def receive(self) -> dict[str, Any]:
        while not self.pending:
            data = await self.stream.receive_some(65536)
            if not data:
                raise trio.BrokenResourceError("peer closed the connection")
            self.pending += self.reader.feed(data)
        return self.pending.pop(0)


class JoinError(Exception):
    pass


async def request_enrolment(
    address: str,
    ca_sha256: bytes,
    cluster_id: str,
    request: dict[str, Any],
    timeout: float = ENROL_TIMEOUT,
) -> tuple[bytes, dict[str, Any]]:
    """Connect to an enrolling member, pin its CA, send ``request``; returns (CA DER, reply)."""
    host, port = split_address(address)
    with trio.fail_after(timeout):
        tcp = await trio.open_tcp_stream(host, port)
        stream = trio.SSLStream(tcp, enrol_context(), server_hostname=None)
        async with stream:
            try:
                await stream.do_handshake()
            except trio.BrokenResourceError as exc:
                raise JoinError(f"TLS with {address} failed: {tls_reason(exc)}") from None
            server_der = stream.getpeercert(binary_form=True)
            channel = MessageStream(stream)
            await channel.send({"t": "enrol-hello", "version": request.get("version", "")})
            reply = await channel.receive()
            if reply["t"] == "refuse":
                raise JoinError(f"{address} refused: {reply['reason']}")
            if reply["t"] != "enrol-ca":
                raise JoinError(f"{address} answered {reply['t']!r}, expected the CA")
            ca_der = reply["ca"]
            if hashlib.sha256(ca_der).digest() != ca_sha256:
                raise JoinError(
                    f"{address} presented CA {hashlib.sha256(ca_der).hexdigest()[:16]}..., the "
                    f"token pins {ca_sha256.hex()[:16]}...: not the cluster in the token, refusing"
                )
            try:
                ca = pki.cert_from_der_untrusted(ca_der)
                if pki.ca_cluster_id(ca) != cluster_id:
                    raise JoinError(f"{address}: CA is not for cluster {cluster_id}")
                pki.check_node_cert_untrusted(server_der or b"", ca, frozenset(), utcnow())
            except pki.CertificateRefused as exc:
                raise JoinError(f"{address} is not a member of the cluster: {exc}") from None
            await channel.send(request)
            reply = await channel.receive()
            if reply["t"] == "refuse":
                raise JoinError(f"{address} refused to enrol us: {reply['reason']}")
            if reply["t"] != "enrolled":
                raise JoinError(f"{address} answered {reply['t']!r}, expected a certificate")
            return ca_der, reply


# -- the session pump -------------------------------------------------------


class Pump:
    """Drives one :class:`Session` over one stream until it closes."""

    def __init__(
        self, stream: trio.abc.Stream, session: Session, on_event: Callable[[Event], None]
    ) -> None:
        self.stream = stream
        self.session = session
        self.on_event = on_event
        self._rearm = trio.Event()
        self._send_lock = trio.Lock()
        self._cancel: trio.CancelScope | None = None

    def kick(self) -> None:
        """Something changed the session from outside (close, a message to send)."""
        self._rearm.set()

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                nursery.start_soon(self._reader)
                nursery.start_soon(self._timer)
                await self._after()
        finally:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await self._flush_quietly()
                try:
                    await self.stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    async def _reader(self) -> None:
        while self.session.closed is None:
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.session.close(f"connection lost: {tls_reason(exc)}")
            else:
                self.session.receive_data(data, trio.current_time(), time.time())
            await self._after()
        await self._after()
        await trio.sleep_forever()  # the nursery is being cancelled

    async def _timer(self) -> None:
        while True:
            deadline = self.session.get_timer()
            self._rearm = rearm = trio.Event()
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await rearm.wait()
            if not rearm.is_set():
                self.session.handle_timer(trio.current_time(), time.time())
            await self._after()  # outside the deadline's scope: a send is never cut in half

    async def _after(self) -> None:
        self._rearm.set()  # input may have moved the session's timer: the timer task re-reads it
        while (event := self.session.next_event()) is not None:
            self.on_event(event)
        await self._flush()
        if self.session.closed is not None and self._cancel is not None:
            self._cancel.cancel()

    async def _flush(self) -> None:
        # Take the bytes only once we may send them: a cancelled wait leaves them queued
        # for _flush_quietly (a refusal must reach the peer even as the link closes).
        async with self._send_lock:
            data = self.session.data_to_send()
            if data:
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self.session.close(f"connection lost: {tls_reason(exc)}")

    async def _flush_quietly(self) -> None:
        data = self.session.data_to_send()
        if data and not self._send_lock.locked():
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                pass
