"""The cluster service of a node: listener, dialer, discovery, revocation, status, commands.

One :class:`Cluster` per node (``node.cluster``). Without an identity it
binds nothing and waits: ``rackboot cluster init`` or ``join`` (control
commands) give it one and it starts serving at once, no restart needed.
"""

from __future__ import annotations

import functools
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from appliance import __version__
from appliance.cluster import authority, pki, wire
from appliance.cluster.discovery import Announcement, Discovery, local_ipv4_addresses
from appliance.cluster.files import ClusterFiles, ClusterStateError, Identity
from appliance.cluster.jointoken import TokenError, decode_untrusted
from appliance.cluster.peers import UP, Backoff, Peer, PeerTable
from appliance.cluster.session import (
    CallReceived,
    Closed,
    CrlReceived,
    Established,
    Event,
    LocalInfo,
    Replied,
    RoleChanged,
    Session,
)
from appliance.cluster.transport import (
    ENROL_TIMEOUT,
    JoinError,
    MessageStream,
    Pump,
    client_context,
    request_enrolment,
    server_context,
    split_address,
    tls_reason,
    utcnow,
)
from appliance.control import ControlRequestError
from appliance.errors import RackbootError
from appliance.logs import get_logger

if TYPE_CHECKING:
    from appliance.api import Settings

log = get_logger("cluster")

NET_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


def explain_tls(reason: str) -> str:
    hints = {
        "CERTIFICATE_VERIFY_FAILED": "its certificate does not verify against our cluster CA "
        "(another cluster, a tampered or self-made certificate)",
        "TLSV1_ALERT_UNKNOWN_CA": "it does not accept our CA (another cluster)",
        "SSLV3_ALERT_BAD_CERTIFICATE": "it rejected our certificate",
        "TLSV13_ALERT_CERTIFICATE_REQUIRED": "it requires a certificate",
        "TLSV1_ALERT_DECRYPT_ERROR": "certificate signature check failed (tampered certificate?)",
        "WRONG_VERSION_NUMBER": "it does not speak TLS",
        "UNSUPPORTED_PROTOCOL": "it does not speak TLS 1.3",
    }
    hint = hints.get(reason.partition(":")[0])
    return f"{reason} ({hint})" if hint else reason


class Cluster:
    def __init__(self, node: Any, settings: Settings, *, rng: random.Random | None = None) -> None:
        self.node = node
        self.settings = settings
        self.files = ClusterFiles(node.data_dir)
        self.rng = rng or random.Random()
        self.identity: Identity | None = None
        self.table: PeerTable | None = None
        self.port: int | None = None
        self.role = str(node.role)
        self.pumps: dict[Pump, tuple[str, int, bool]] = {}  # pump -> (node id, serial, outbound)
        self.counters = {"refused": 0, "garbage": 0, "enrolled": 0, "crl_updates": 0}
        self.discovery: Discovery | None = None
        self._has_identity = trio.Event()
        self._dial_wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._lock = trio.Lock()  # init / join / token / remove, one at a time
        # Requests other members may send over a link (cluster protocol 2): name ->
        # handler(caller's node id, args) -> result; a RackbootError is answered as an error.
        self.handlers: dict[str, Callable[[str, dict[str, Any]], Awaitable[Any]]] = {}
        self._calls: dict[int, tuple[trio.Event, list[Replied]]] = {}
        self._call_ids = itertools.count(1)

    # -- the service ------------------------------------------------------------

    async def run(self, node: Any, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self.files.enrolled():
            self._adopt(await trio.to_thread.run_sync(self.files.load, utcnow()))
        elif self.settings.enabled == "on":
            raise ClusterStateError(
                "[cluster] enabled = 'on' but this node has no cluster identity; "
                "run `rackboot cluster init` or `rackboot cluster join TOKEN` first"
            )
        if self.identity is None:
            log.info("not a cluster member yet", hint="rackboot cluster init | join TOKEN")
            task_status.started()
            await self._has_identity.wait()
            await self._serve()
        else:
            await self._serve(task_status)

    def _adopt(self, identity: Identity) -> None:
        self.identity = identity
        self.table = PeerTable(
            identity.node_id,
            identity.short_fingerprint,
            rng=self.rng,
            backoff=Backoff(0.5, self.settings.backoff_max),
        )
        for address in (*self.settings.peers, *identity.seeds):
            self.table.add_static(address)
        if not self._has_identity.is_set():  # a member from now on: its metrics appear
            self.node.metrics.register(_Metrics(self))
        self._has_identity.set()

    async def _serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        identity = self.identity
        assert identity is not None and self.table is not None
        self.server_ctx = server_context(identity)
        self.client_ctx = client_context(identity)
        listeners = await trio.open_tcp_listeners(
            self.settings.port, host=str(self.settings.listen)
        )
        self.port = listeners[0].socket.getsockname()[1]
        log.info(
            "cluster member",
            cluster=identity.cluster_id,
            node_id=identity.node_id,
            listen=f"{self.settings.listen}:{self.port}",
            ca_holder=identity.is_ca,
            mdns=self.settings.mdns,
            static_peers=len(self.settings.peers),
        )
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for listener in listeners:
                    nursery.start_soon(self._accept, listener)
                nursery.start_soon(self._dial_loop)
                if self.settings.mdns:
                    await nursery.start(self._discover)
                task_status.started()
        finally:
            self._nursery = None

    # -- addresses ----------------------------------------------------------------

    def advertised(self) -> list[str]:
        """host:port addresses peers (and join tokens) use to reach us."""
        if self.settings.advertise:
            return [self.settings.advertise]
        port = self.port if self.port is not None else self.settings.port
        listen = str(self.settings.listen)
        if listen != "0.0.0.0":
            return [f"{listen}:{port}"]
        return [f"{a}:{port}" for a in local_ipv4_addresses()]

    def local_info(self) -> LocalInfo:
        identity = self.identity
        assert identity is not None
        advertised = self.advertised()
        return LocalInfo(
            cluster_id=identity.cluster_id,
            node_id=identity.node_id,
            name=self.node.config.node.name,
            rack=self.node.config.node.rack,
            role=self.role,
            version=self.node.speaks.version,
            addr=advertised[0] if advertised else "",
            crl=identity.revocations.number,
            proto_min=self.node.speaks.cluster.lo,
            proto_max=self.node.speaks.cluster.hi,
        )

    # -- discovery ----------------------------------------------------------------

    async def _discover(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        identity = self.identity
        assert identity is not None and self.table is not None
        info = self.local_info()
        addresses = [split_address(a)[0] for a in self.advertised()]
        self.discovery = Discovery(
            instance=f"{info.name}-{identity.node_id[:6]}",
            port=self.port or 0,
            addresses=addresses,
            txt={
                "node": identity.node_id,
                "name": info.name,
                "rack": info.rack,
                "cluster": identity.short_fingerprint,
                "version": info.version,
                "role": self.role,
            },  # fmt: skip
        )
        started = False
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.discovery.run)
                task_status.started()
                started = True
                instances: dict[str, str] = {}
                async for ann in self.discovery.receive:
                    self._announced(ann, instances)
        except Exception as exc:  # no multicast here: the links still work with static peers
            log.error(
                "mDNS discovery failed: static peers only",
                error=f"{type(exc).__name__}: {exc}",
            )
            if not started:
                task_status.started()

    def _announced(self, ann: Announcement, instances: dict[str, str]) -> None:
        assert self.table is not None
        if ann.removed:
            node_id = instances.pop(ann.instance, "")
            if node_id:
                self.table.withdrawn(node_id)
            return
        info = {"name": ann.name, "rack": ann.rack, "role": ann.role, "version": ann.version}
        before = ann.node_id in self.table.peers
        if self.table.discovered(ann.node_id, ann.cluster, ann.address, info):
            instances[ann.instance] = ann.node_id
            if not before:
                log.info("discovered peer", node_id=ann.node_id, name=ann.name, address=ann.address)
            self._dial_wake.set()
        elif ann.node_id != self.table.node_id:
            log.debug("ignoring mDNS announcement of another cluster", service=ann.instance)

    # -- outbound -----------------------------------------------------------------

    async def _dial_loop(self) -> None:
        assert self.table is not None and self._nursery is not None
        while True:
            for peer in self.table.due(trio.current_time()):
                self.table.dialing(peer)
                self._nursery.start_soon(self._dial, peer)
            deadline = self.table.next_deadline()
            self._dial_wake = trio.Event()
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await self._dial_wake.wait()

    async def _dial(self, peer: Peer) -> None:
        assert self.identity is not None and self.table is not None
        address = peer.address
        try:
            host, port = split_address(address)
            with trio.fail_after(self.settings.connect_timeout):
                tcp = await trio.open_tcp_stream(host, port)
                stream = trio.SSLStream(tcp, self.client_ctx, server_hostname=None)
                try:
                    await stream.do_handshake()
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except (*NET_ERRORS, ValueError) as exc:
            reason = (
                "timed out" if isinstance(exc, trio.TooSlowError) else explain_tls(tls_reason(exc))
            )
            self._dial_failed(peer, f"cannot connect to {address}: {reason}")
            return
        try:
            who = pki.check_node_cert_untrusted(
                stream.getpeercert(binary_form=True) or b"",
                self.identity.ca,
                self.identity.revocations.serials,
                utcnow(),
            )
        except pki.CertificateRefused as exc:
            self.counters["refused"] += 1
            log.warning("refused peer", address=address, direction="outbound", reason=str(exc))
            await trio.aclose_forcefully(stream)
            self._dial_failed(peer, f"refused: {exc}", refused=True)
            return
        session = self._session(who.node_id)
        pump = Pump(stream, session, lambda ev: self._event(ev, pump, peer))
        self.pumps[pump] = (who.node_id, who.serial, True)
        try:
            await pump.run()
        finally:
            del self.pumps[pump]
            closed = session.closed or Closed("shutting down")
            self._session_ended(closed, who.node_id, address, outbound=True)
            if session.peer is not None:  # the entry may have merged into the node id's
                peer = self.table.peers.get(who.node_id, peer)
            was_up = peer.state == UP
            self._dial_failed(
                peer, closed.reason, refused=closed.refused or closed.refused_by_peer, quiet=True
            )
            if was_up:
                log.warning("peer down", node_id=who.node_id, name=peer.name, reason=closed.reason)

    def _dial_failed(self, peer: Peer, reason: str, *, refused: bool = False, quiet=False) -> None:
        assert self.table is not None
        first = peer.attempts == 0 or peer.reason != reason
        self.table.failed(peer, reason, trio.current_time(), refused=refused)
        if not quiet:
            (log.info if first else log.debug)(
                "peer unreachable", address=peer.address, reason=reason, retry_in=round(
                    peer.next_attempt - trio.current_time(), 2)
            )  # fmt: skip
        self._dial_wake.set()

    # -- inbound ------------------------------------------------------------------

    async def _accept(self, listener: trio.SocketListener) -> None:
        assert self._nursery is not None
        while True:
            tcp = await listener.accept()
            self._nursery.start_soon(self._inbound, tcp)

    async def _inbound(self, tcp: trio.SocketStream) -> None:
        assert self.identity is not None and self.table is not None
        try:
            host, port = tcp.socket.getpeername()[:2]
            address = f"{host}:{port}"
        except OSError:
            address = "?"
        stream = trio.SSLStream(tcp, self.server_ctx, server_side=True)
        try:
            with trio.fail_after(self.settings.connect_timeout):
                await stream.do_handshake()
        except NET_ERRORS as exc:
            self.counters["refused"] += 1
            reason = "TLS handshake timed out" if isinstance(exc, trio.TooSlowError) else (
                "TLS handshake failed: " + explain_tls(tls_reason(exc)))  # fmt: skip
            log.warning("refused connection", peer=address, reason=reason)
            await trio.aclose_forcefully(stream)
            return
        der = stream.getpeercert(binary_form=True)
        if not der:
            await self._serve_enrolment(stream, address)
            return
        try:
            who = pki.check_node_cert_untrusted(
                der, self.identity.ca, self.identity.revocations.serials, utcnow()
            )
        except pki.CertificateRefused as exc:
            self.counters["refused"] += 1
            log.warning("refused peer", peer=address, direction="inbound", reason=str(exc))
            with trio.move_on_after(1):
                try:
                    await stream.send_all(wire.encode({"t": "refuse", "reason": str(exc)}))
                except NET_ERRORS:
                    pass
            await trio.aclose_forcefully(stream)
            return
        session = self._session(who.node_id)
        pump = Pump(stream, session, lambda ev: self._event(ev, pump, None))
        self.pumps[pump] = (who.node_id, who.serial, False)
        try:
            await pump.run()
        finally:
            del self.pumps[pump]
            if session.established or session.peer is not None:
                self.table.inbound(who.node_id, -1)
            self._session_ended(
                session.closed or Closed("shutting down"), who.node_id, address, outbound=False
            )

    async def _serve_enrolment(self, stream: trio.SSLStream, address: str) -> None:
        assert self.identity is not None
        channel = MessageStream(stream, max_message=64 * 1024)

        async def refuse(reason: str) -> None:
            self.counters["refused"] += 1
            log.warning("refused peer", peer=address, reason=reason)
            with trio.move_on_after(1):
                try:
                    await channel.send({"t": "refuse", "reason": reason})
                except NET_ERRORS:
                    pass

        try:
            with trio.fail_after(ENROL_TIMEOUT):
                first = await channel.receive()
                if first["t"] != "enrol-hello":
                    return await refuse(
                        "presented no certificate: not enrolled in this cluster "
                        "(join it with `rackboot cluster join TOKEN`)"
                    )
                if not self.identity.is_ca:
                    return await refuse(
                        "this member does not hold the CA key and cannot enrol; "
                        "use a token made on the CA holder"
                    )
                await channel.send({"t": "enrol-ca", "ca": pki.cert_der(self.identity.ca)})
                request = await channel.receive()
                if request["t"] != "enrol":
                    return await refuse(f"expected an enrolment request, got {request['t']}")
                try:
                    async with self._lock:
                        done = await trio.to_thread.run_sync(
                            authority.enrol, self.files, request, time.time()
                        )
                except authority.EnrolRefused as exc:
                    return await refuse(f"enrolment refused: {exc}")
                await channel.send(
                    {
                        "t": "enrolled",
                        "cert": done.cert_der,
                        "node": done.node_id,
                        "crl": done.crl_der,
                    }
                )
                self.counters["enrolled"] += 1
                log.info("enrolled node", node_id=done.node_id, name=done.name, peer=address)
        except wire.FrameError as exc:
            self.counters["garbage"] += 1
            log.warning("refused peer", peer=address, reason=f"bad enrolment message: {exc}")
        except NET_ERRORS as exc:
            log.info("enrolment connection ended", peer=address, reason=tls_reason(exc))
        finally:
            await trio.aclose_forcefully(stream)

    # -- sessions -----------------------------------------------------------------

    def _session(self, node_id: str) -> Session:
        return Session(
            self.local_info(),
            trio.current_time(),
            expected_node=node_id,
            keepalive=self.settings.keepalive,
            dead_after=self.settings.dead_after,
            max_message=self.settings.max_message,
        )

    def _event(self, event: Event, pump: Pump, peer: Peer | None) -> None:
        assert self.table is not None and self.identity is not None
        now, wall = trio.current_time(), time.time()
        session = pump.session
        if isinstance(event, Established):
            hello = {k: getattr(event.peer, k) for k in ("name", "rack", "role", "version", "addr")}
            if peer is not None:
                entry = self.table.established(peer, event.peer.node_id, hello, now, wall)
                log.info(
                    "peer up", node_id=event.peer.node_id, name=event.peer.name,
                    rack=event.peer.rack, address=entry.address, version=event.peer.version,
                )  # fmt: skip
            else:
                self.table.seen(event.peer.node_id, now, wall, hello)
                self.table.inbound(event.peer.node_id, +1)
                entry = self.table.peers.get(event.peer.node_id)
                if entry is not None and entry.state != UP:
                    entry.next_attempt = now  # it is back: dial it now, not after the backoff
                    self._dial_wake.set()
            if event.peer.crl < self.identity.revocations.number:
                session.send_crl(self.identity.revocations.der)
        elif isinstance(event, RoleChanged):
            self.table.seen(session.peer.node_id, now, wall, {"role": event.role})  # type: ignore[union-attr]
        elif isinstance(event, CrlReceived):
            self.accept_crl(event.der)
        elif isinstance(event, CallReceived) and self._nursery is not None:
            self._nursery.start_soon(self._answer, pump, event)
        elif isinstance(event, Replied) and event.id in self._calls:
            done, answer = self._calls[event.id]
            answer.append(event)
            done.set()

    def _session_ended(self, closed: Closed, node_id: str, address: str, outbound: bool) -> None:
        if closed.garbage:
            self.counters["garbage"] += 1
        if closed.refused or closed.garbage:
            self.counters["refused"] += 1
            log.warning(
                "refused peer", node_id=node_id, peer=address,
                direction="outbound" if outbound else "inbound", reason=closed.reason,
            )  # fmt: skip
        elif closed.refused_by_peer:
            log.warning("peer refused us", node_id=node_id, peer=address, reason=closed.reason)

    # -- requests between members (cluster protocol 2) ------------------------------

    async def call(
        self, node_id: str, cmd: str, args: dict[str, Any], timeout: float = 10.0
    ) -> Any:
        """Run ``cmd`` on member ``node_id`` over a link to it; its result, or a
        :class:`RackbootError` saying why not (no link, an older peer, its error, no answer
        within ``timeout``)."""
        links = [pump for pump, (peer, _, _) in self.pumps.items()
                 if peer == node_id and pump.session.established]  # fmt: skip
        if not links:
            raise RackbootError(f"no link to {node_id} (down, or not a member)")
        pump, call_id = links[0], next(self._call_ids)
        try:
            pump.session.call(call_id, cmd, args)
        except ValueError as exc:
            raise RackbootError(str(exc)) from None
        done, answer = self._calls[call_id] = (trio.Event(), [])
        pump.kick()
        try:
            with trio.move_on_after(timeout):
                await done.wait()
        finally:
            del self._calls[call_id]
        if not answer:
            raise RackbootError(f"{node_id} did not answer {cmd} within {timeout:g} s")
        if not answer[0].ok:
            raise RackbootError(f"{node_id}: {answer[0].error}")
        return answer[0].result

    async def _answer(self, pump: Pump, call: CallReceived) -> None:
        caller = self.pumps.get(pump, ("?",))[0]
        handler = self.handlers.get(call.cmd)
        try:
            if handler is None:
                raise RackbootError(f"this node takes no request {call.cmd!r}")
            pump.session.reply(call.id, True, await handler(caller, call.args))
        except RackbootError as exc:
            pump.session.reply(call.id, False, error=str(exc)[:500])
        except Exception as exc:  # a handler's bug: answered, logged, the link and node live on
            log.error("a request from a peer failed", cmd=call.cmd, node_id=caller,
                      error=f"{type(exc).__name__}: {exc}")  # fmt: skip
            pump.session.reply(call.id, False, error=f"internal error: {type(exc).__name__}")
        pump.kick()

    # -- revocation ---------------------------------------------------------------

    def accept_crl(self, der: bytes) -> bool:
        """A revocation list from a peer or our CA: adopt it if newer and valid."""
        identity = self.identity
        assert identity is not None
        try:
            crl = pki.crl_from_der_untrusted(der, identity.ca)
        except pki.CertificateRefused as exc:
            log.warning("ignoring revocation list", reason=str(exc))
            return False
        if crl.number <= identity.revocations.number:
            return False
        self.identity = identity = _replace(identity, revocations=crl)
        self.counters["crl_updates"] += 1
        log.info("revocation list updated", number=crl.number, revoked=len(crl.serials))
        if self._nursery is not None:
            self._nursery.start_soon(self._store_crl, crl.der, crl.number)
        for pump, (node_id, serial, _) in list(self.pumps.items()):
            if serial in crl.serials:
                pump.session.close(f"node {node_id} was revoked")
                log.warning("closing link to revoked node", node_id=node_id)
            else:
                pump.session.send_crl(crl.der)
            pump.kick()
        if identity.cert.serial_number in crl.serials:
            log.error("this node has been removed from the cluster", node_id=identity.node_id)
        return True

    async def _store_crl(self, der: bytes, number: int) -> None:
        def write() -> None:
            current = self.files.read("crl.der") if self.files.exists("crl.der") else b""
            if current:
                try:
                    if pki.crl_from_der_untrusted(current, self.identity.ca).number >= number:  # type: ignore[union-attr]
                        return
                except pki.CertificateRefused:
                    pass
            self.files.write("crl.der", der, 0o644)

        await trio.to_thread.run_sync(write)

    # -- role -------------------------------------------------------------------------

    def set_role(self, role: str) -> None:
        self.role = role
        for pump in list(self.pumps):
            pump.session.set_role(role)

    # -- control commands -----------------------------------------------------------

    def control_commands(self) -> dict[str, Any]:
        return {
            "cluster.init": self.cmd_init,
            "cluster.token": self.cmd_token,
            "cluster.join": self.cmd_join,
            "cluster.remove": self.cmd_remove,
        }

    async def cmd_init(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require_enabled()
        async with self._lock:
            identity = await trio.to_thread.run_sync(
                authority.init_cluster, self.files, self.node.config.node.name, time.time()
            )
            self._adopt(identity)
            log.info("created cluster", cluster=identity.cluster_id, node_id=identity.node_id)
            await self._wait_listening()
            token = await self._token()
        return {
            "cluster_id": identity.cluster_id,
            "node_id": identity.node_id,
            "ca_fingerprint": identity.ca_fingerprint,
            "token": token.encode(),
            "expires": token.expires,
        }

    async def cmd_token(self, args: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            token = await self._token()
        return {
            "token": token.encode(),
            "expires": token.expires,
            "addresses": list(token.addresses),
        }

    async def _token(self):
        return await trio.to_thread.run_sync(
            authority.issue_token,
            self.files,
            self.advertised(),
            self.settings.token_ttl,
            time.time(),
        )

    async def cmd_join(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require_enabled()
        text = args.get("token")
        if not isinstance(text, str):
            raise ControlRequestError("cluster.join needs a 'token' string")
        async with self._lock:
            try:
                with trio.fail_after(9):  # answer before the control socket gives up (10 s)
                    identity = await join_cluster(
                        self.files, text, self.node.config.node.name, self.node.config.node.rack
                    )
            except trio.TooSlowError:
                raise RackbootError(
                    "no member in the token answered within 9 s; check the address and try again"
                ) from None
            self._adopt(identity)
            await self._wait_listening()
        return {"cluster_id": identity.cluster_id, "node_id": identity.node_id}

    async def cmd_remove(self, args: dict[str, Any]) -> dict[str, Any]:
        who = args.get("node")
        if not isinstance(who, str) or not who:
            raise ControlRequestError("cluster.remove needs a 'node' (node id or name)")
        async with self._lock:
            node_id, crl = await trio.to_thread.run_sync(
                authority.revoke, self.files, who, time.time()
            )
        log.info("removed node", node_id=node_id, crl=crl.number)
        self.accept_crl(crl.der)
        return {"node_id": node_id, "crl": crl.number, "revoked": len(crl.serials)}

    def _require_enabled(self) -> None:
        if self.settings.enabled == "off":
            raise RackbootError("[cluster] enabled = 'off' in the configuration")

    async def _wait_listening(self) -> None:
        with trio.move_on_after(10):
            while self.port is None:
                await trio.sleep(0.01)

    # -- status -----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        identity = self.identity
        if identity is None or self.table is None:
            return {"state": "off" if self.settings.enabled == "off" else "not a member"}
        now, wall = trio.current_time(), time.time()
        for pump, (node_id, _, outbound) in self.pumps.items():
            peer = self.table.peers.get(node_id)
            if peer is not None and pump.session.peer is not None:
                last = pump.session.last_rx
                if peer.last_seen is None or last > peer.last_seen:
                    peer.last_seen, peer.last_seen_wall = last, wall - (now - last)
                if outbound:
                    peer.rtt, peer.clock_skew = pump.session.rtt, pump.session.clock_skew
        me = self.local_info()
        site = [
            {
                "node_id": identity.node_id, "name": me.name, "rack": me.rack, "role": me.role,
                "address": me.addr, "version": me.version, "state": "self", "health": "online",
                "last_seen_ago": 0.0, "last_seen": wall, "reason": "", "sources": [], "rtt_ms": None,
                "clock_skew": 0.0, "self": True,
            },
            *self.table.snapshot(now),
        ]  # fmt: skip
        return {
            "state": "member",
            "cluster_id": identity.cluster_id,
            "node_id": identity.node_id,
            "ca_fingerprint": identity.ca_fingerprint,
            "ca_holder": identity.is_ca,
            "listen": f"{self.settings.listen}:{self.port}",
            "mdns": self.settings.mdns,
            "revocation_list": identity.revocations.number,
            "revoked": len(identity.revocations.serials),
            "links": len(self.pumps),
            "counters": {
                **self.counters,
                "other_cluster_announcements": self.table.ignored_other_cluster,
                "mdns_dropped": self.discovery.dropped if self.discovery else 0,
            },
            "site": site,
        }


class _Metrics:
    """The cluster's Prometheus metrics, read from the live state at scrape time."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        table = self.cluster.table
        peers = GaugeMetricFamily(
            "rackboot_cluster_peers", "Known peers by state", labels=["state"]
        )
        for state in ("up", "down", "connecting", "refused"):
            count = sum(1 for p in table.peers.values() if p.state == state) if table else 0
            peers.add_metric([state], count)
        yield peers
        events = CounterMetricFamily(
            "rackboot_cluster_events",
            "Refusals, garbage, enrolments, CRL updates",
            labels=["event"],
        )
        for name, value in self.cluster.counters.items():
            events.add_metric([name], value)
        yield events


def _replace(identity: Identity, **changes: Any) -> Identity:
    import dataclasses

    return dataclasses.replace(identity, **changes)


async def join_cluster(files: ClusterFiles, text: str, name: str, rack: str) -> Identity:
    """Enrol this node with the member named in a join token; stores the new identity."""
    try:
        token = decode_untrusted(text, time.time())
    except TokenError as exc:
        raise RackbootError(f"cannot use this token: {exc}") from None
    authority.refuse_if_member(files)
    key = pki.new_key()
    csr = pki.make_csr(key, name)
    request = {
        "t": "enrol", "token": token.token_id, "secret": token.secret,
        "csr": pki.csr_der(csr), "name": name, "rack": rack,
        "version": __version__,
    }  # fmt: skip
    errors = []
    for address in token.addresses:
        try:
            ca_der, reply = await request_enrolment(
                address, token.ca_sha256, token.cluster_id, request
            )
            ca = pki.cert_from_der_untrusted(ca_der)
            crl = pki.crl_from_der_untrusted(reply["crl"], ca)
            who = pki.check_node_cert_untrusted(reply["cert"], ca, crl.serials, utcnow())
            if pki.cert_from_der_untrusted(reply["cert"]).public_key() != key.public_key():
                raise JoinError("the certificate received is not for our key")
        except (*NET_ERRORS, JoinError, wire.FrameError, pki.CertificateRefused, ValueError) as exc:
            reason = (
                "timed out" if isinstance(exc, trio.TooSlowError) else str(exc) or tls_reason(exc)
            )
            errors.append(f"{address}: {reason}")
            continue
        identity = await trio.to_thread.run_sync(
            functools.partial(
                authority.adopt_enrolment, files, pki.key_to_pem(key), ca_der, reply["cert"],
                crl.der, time.time(), (address,),
            )
        )  # fmt: skip
        log.info("joined cluster", cluster=identity.cluster_id, node_id=who.node_id, via=address)
        return identity
    raise RackbootError("could not join the cluster: " + "; ".join(errors))
