"""Replication's trio shell: the active appliance's listener, a standby's dialer.

Each appliance of a rack with ``[ha]`` peers listens on ``[ha] listen``, TCP
port ``[ha] port + 1`` (mutual TLS 1.3 with cluster certificates, as the peer links;
only the rack's other appliances are let in). While it holds the lease it
serves every standby that connects one :class:`~replication.LeaderStream`;
otherwise it says ``not-leader`` and closes. A standby dials the rack's other
appliances in turn until one leads, and follows it
(:class:`~replication.FollowerStream`): its log ends as the leader's, each
batch is acknowledged after its fsync. A refused frame is counted by reason
and ends the link; the standby dials again.

``followers`` is the leader's view (stage, acknowledged LSN, lag) that the
commit policy and ``rackboot status`` read.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any

import trio

from appliance import compat
from appliance.cluster import pki
from appliance.cluster.transport import client_context, server_context, tls_reason, utcnow
from appliance.logs import get_logger
from appliance.state.commit import CommitRule
from appliance.state.replication import Append, FollowerStream, Install, LeaderStream, Truncate
from appliance.state.signing import MAX_FRAME, Refused, open_untrusted, seal
from appliance.state.store import StateStore

log = get_logger("state")

LENGTH = struct.Struct(">I")
# A link that breaks, stalls or presents a bad certificate ends; the standby dials again.
LINK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
               pki.CertificateRefused, OSError)  # fmt: skip
HANDSHAKE_TIMEOUT = 5.0
RETRY = (0.1, 2.0)  # a standby's redial backoff: first, longest
ACK_TIMEOUT = 0.5  # s a streaming standby may leave a record unacknowledged before it is
# declared ineligible (the active then commits without it, once a majority has it)
ELIGIBILITY_TICK = 0.05  # s between looks at the standbys' progress
PING_INTERVAL = 1.0  # s between clock probes of each standby
# A standby ends a link on which nothing (not even a ping) came for this long: a leader
# that vanished without closing it (power cut, cable) would otherwise be followed for ever.
FOLLOWER_TIMEOUT = 3 * PING_INTERVAL


class Link:
    """Signed frames, length-prefixed, over one TLS stream."""

    def __init__(self, stream: trio.SSLStream, identity: Any, peer_key: Any, peer: str) -> None:
        self.stream, self.identity, self.peer = stream, identity, peer
        self.peer_key = peer_key
        self._buffer = bytearray()
        # Two tasks send on a link (a standby's pongs and its acknowledgements; a leader's
        # answers and its send loop): one SSLStream.send_all at a time, else BusyResourceError.
        self._sending = trio.Lock()

    async def send(self, message: list[Any]) -> None:
        frame = seal(message, self.identity.key, self.identity.node_id)
        async with self._sending:
            await self.stream.send_all(LENGTH.pack(len(frame)) + frame)

    async def receive(self) -> Any:
        while True:
            if len(self._buffer) >= LENGTH.size:
                (size,) = LENGTH.unpack_from(self._buffer)
                if size > MAX_FRAME:
                    raise Refused("malformed", f"a frame of {size} bytes announced")
                if len(self._buffer) >= LENGTH.size + size:
                    frame = bytes(self._buffer[LENGTH.size : LENGTH.size + size])
                    del self._buffer[: LENGTH.size + size]
                    signer, message = open_untrusted(frame, self._key_of)
                    return message
            data = await self.stream.receive_some(256 * 1024)
            if not data:
                raise trio.BrokenResourceError("closed by the peer")
            self._buffer += data

    def _key_of(self, signer: str) -> Any:
        return self.peer_key if signer == self.peer else None


class Durable:
    """The last LSN a follower has on disk, and an event when it moves."""

    def __init__(self) -> None:
        self.lsn = 0
        self.changed = trio.Event()

    def reached(self, lsn: int) -> None:
        self.lsn = max(self.lsn, lsn)
        self.changed.set()


class Replication:
    def __init__(self, node: Any, store: StateStore, peers: dict[str, tuple[str, int]],
                 listen: str, port: int) -> None:  # fmt: skip
        self.node, self.store = node, store
        self.peers = peers  # node id -> (host, replication port) of the rack's other appliances
        self.listen, self.port = listen, port
        self.followers: dict[str, LeaderStream] = {}
        self.following: dict[str, Any] = {}  # a standby's view of its leader
        self.refused: dict[str, int] = {}
        self._appended = trio.Event()
        self._unfollowed_append = trio.Event()
        self.known_epoch: Callable[[], int] = lambda: 0
        store.on_append.append(self._wake_sender)
        self.election: Any = None  # the embedded election, once the HA service made it
        self.poke_election: Callable[[], None] = lambda: None  # its runner re-reads its timer
        self._links: dict[str, trio.CancelScope] = {}  # peer -> its leader link
        self.rule = CommitRule(peers, ack_timeout=ACK_TIMEOUT)
        self.speaks = getattr(node, "speaks", compat.THIS)  # stated to each peer (compat.py)
        self.problems: dict[str, str] = {}  # peer -> why the last link with it was refused

    @property
    def identity(self) -> Any:
        return self.node.cluster.identity

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.listen)
        log.info("replication listening", address=f"{self.listen}:{self.port}",
                 peers=sorted(self.peers))  # fmt: skip
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._inbound, listeners)
            nursery.start_soon(self._follow_loop)
            nursery.start_soon(self._eligibility_loop)
            task_status.started()

    # -- who must acknowledge before a record commits (appliance/state/commit.py) ---------

    def committable(self, durable: int) -> int:
        """The store's commit policy while this node holds the lease."""
        return self.rule.committable(durable, self.followers, self._skipped())

    def _skipped(self) -> frozenset[str]:
        if self.election is None:
            return frozenset()
        proposer = self.election.proposer
        return (proposer.granted_ineligible & proposer.wanted_ineligible) - self.rule.recounting

    async def _eligibility_loop(self) -> None:
        while True:
            self.refresh_eligibility()  # timeouts; acknowledgements refresh it at once
            with trio.move_on_after(ELIGIBILITY_TICK):
                await self._unfollowed_append.wait()
            self._unfollowed_append = trio.Event()

    def refresh_eligibility(self) -> None:
        """Tell the election who lags now (it renews at once when that changed), and commit
        what the acknowledgements and the ineligibility in force allow."""
        if self.election is not None:
            now, store = trio.current_time(), self.store
            lagging = self.rule.lagging(
                now, leading=self.node.fence.ok(), last=store.last(), committed=store.tables.lsn,
                pending=store.last() > store.tables.lsn, followers=self.followers,
                declared=self.election.proposer.wanted_ineligible,
            )  # fmt: skip
            changed = self.election.set_ineligible(lagging, now)
            if self.election.set_caught_up(self.caught_up(), now) or changed:
                self.poke_election()
        self.store.advance()

    def caught_up(self) -> frozenset[str]:
        """Standbys that have everything committed and count for commits: one may take a
        handed-over lease at once (appliance/ha/proposer.py, hand_over)."""
        committed, skip = self.store.tables.lsn, self._skipped()
        return frozenset(
            peer for peer, follower in self.followers.items()
            if follower.stage == "stream" and follower.acked >= committed and peer not in skip
        )  # fmt: skip

    # -- TLS and who the peer is ------------------------------------------------------

    async def _authenticate(self, stream: trio.SSLStream) -> tuple[str, Any]:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            await stream.do_handshake()
        identity = self.identity
        der = stream.getpeercert(binary_form=True) or b""
        who = pki.check_node_cert_untrusted(der, identity.ca, identity.revocations.serials,
                                            utcnow())  # fmt: skip
        if who.node_id not in self.peers:
            raise Refused("stranger", f"node {who.node_id} is not one of the rack's appliances")
        return who.node_id, pki.cert_from_der_untrusted(der).public_key()

    def _refused_all(self, group: BaseExceptionGroup, peer: str) -> None:
        for exc in _leaves(group):
            reason = exc.reason if isinstance(exc, Refused) else "malformed"
            self.refused[reason] = self.refused.get(reason, 0) + 1
            if reason in ("incompatible", "refused-by-leader"):
                self.problems[peer] = str(exc)
            log.warning("replication link refused", peer=peer, reason=reason, detail=str(exc)[:200])

    def _ended(self, group: BaseExceptionGroup, peer: str) -> None:
        reasons = sorted({tls_reason(exc) for exc in _leaves(group)})
        log.info("replication link ended", peer=peer, reason="; ".join(reasons))

    # -- the leader's side ------------------------------------------------------------

    async def _inbound(self, tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, server_context(self.identity), server_side=True)
        peer, scope, leader = "?", trio.CancelScope(), None
        try:
            peer, key = await self._authenticate(stream)
            link = Link(stream, self.identity, key, peer)
            fence = self.node.fence
            if not fence.ok():
                await link.send(["not-leader"])
                return
            leader = LeaderStream(self.store, fence.epoch, self.speaks, f"appliance {peer}")
            previous = self._links.get(peer)
            if previous is not None:
                previous.cancel()  # a standby's newest link wins: it redialled for a reason
            self._links[peer] = scope
            with scope:
                await self._lead(link, leader)
        except* Refused as group:
            self._refused_all(group, peer)
        except* LINK_ERRORS as group:
            self._ended(group, peer)
        finally:
            if self._links.get(peer) is scope:
                del self._links[peer]
            if leader is not None and self.followers.get(peer) is leader:
                del self.followers[peer]
            with trio.move_on_after(1, shield=True):
                await stream.aclose()

    async def _lead(self, link: Link, stream: LeaderStream) -> None:
        self.followers[link.peer] = stream
        log.info("a standby follows", peer=link.peer, epoch=stream.epoch)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send_loop, link, stream, nursery.cancel_scope)
            while True:
                answer = stream.receive(await link.receive(), time.time())
                if answer is not None:
                    await link.send(answer)
                if stream.refused:
                    raise Refused("incompatible", stream.refused)
                self.problems.pop(link.peer, None)
                self.refresh_eligibility()  # an acknowledgement may commit records
                self._wake_sender()

    def _wake_sender(self) -> None:
        """Records were appended or acknowledged: the send loops look again, and so does the
        eligibility loop when a standby does not follow (declared at once, not a tick later:
        a new active's first commit waits for it)."""
        self._appended.set()
        self._appended = trio.Event()
        if len(self.followers) < len(self.peers):
            self._unfollowed_append.set()

    async def _send_loop(self, link: Link, stream: LeaderStream, scope: trio.CancelScope) -> None:
        fence = self.node.fence
        next_ping = trio.current_time()
        while True:
            if not fence.ok() or fence.epoch != stream.epoch:
                scope.cancel()  # deposed: this node leads no one
                return
            if trio.current_time() >= next_ping:
                if ping := stream.ping(time.time()):  # none before the stream starts
                    await link.send(ping)
                next_ping = trio.current_time() + PING_INTERVAL
            message = stream.next_message()
            if message is None:
                with trio.move_on_at(min(fence.valid_until, next_ping)):
                    await self._appended.wait()
                continue
            await link.send(message)

    # -- a standby's side -------------------------------------------------------------

    async def _follow_loop(self) -> None:
        delay = RETRY[0]
        while True:
            if self.node.fence.ok():
                self.following = {}
                await trio.sleep(RETRY[1] / 4)  # the leader: nobody to follow
                continue
            for peer, address in sorted(self.peers.items()):
                if await self._follow(peer, address):
                    delay = RETRY[0]
            await trio.sleep(delay)
            delay = min(RETRY[1], delay * 2)

    async def _follow(self, peer: str, address: tuple[str, int]) -> bool:
        """Follow ``peer`` if it leads; True if it did, for a while."""
        host, port = address
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                tcp = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError):
            return False
        stream = trio.SSLStream(tcp, client_context(self.identity), server_hostname=None)
        try:
            who, key = await self._authenticate(stream)
            if who != peer:
                raise Refused("stranger", f"{host} is node {who}, not {peer}")
            link = Link(stream, self.identity, key, peer)
            await self._stream_from(link)
            return True
        except* Refused as group:
            self._refused_all(group, peer)
        except* LINK_ERRORS as group:
            self._ended(group, peer)
        finally:
            self.following = {}
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
        return False

    async def _stream_from(self, link: Link) -> None:
        store = self.store
        await store.prepare_to_follow()  # what it appended as a leader commits; damage goes
        last = store.position
        side = FollowerStream((last.epoch, last.lsn), store.tables.history, self.known_epoch(),
                              self.speaks, f"appliance {link.peer}")  # fmt: skip
        await link.send(side.hello())
        self.following = {"leader": link.peer, "stage": "hello"}
        durable = Durable()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._acknowledge, link, side, durable)
            while True:
                with trio.fail_after(FOLLOWER_TIMEOUT):
                    message = await link.receive()
                if message == ["not-leader"] or self.node.fence.ok():
                    nursery.cancel_scope.cancel()  # it does not lead, or this node does now
                    return
                # A frame from a lower epoch than the election has seen since the hello is
                # a deposed leader's, late: refused, even on this older link.
                side.saw_epoch(self.known_epoch())
                actions, answer = side.receive(message, time.time())
                for action in actions:
                    await self._do(action, durable)
                if side.stage == "cut":
                    self.problems.pop(link.peer, None)
                    answer = side.resume(store.position.epoch, store.position.lsn)
                if answer is not None:
                    await link.send(answer)
                self.following = {"leader": link.peer, "stage": side.stage,
                                  "lsn": store.position.lsn, "epoch": side.highest_epoch,
                                  "version": side.peer.version if side.peer else ""}  # fmt: skip

    async def _do(self, action: Any, durable: Durable) -> None:
        if isinstance(action, Truncate):
            await self.store.cut_after(action.lsn)
        elif isinstance(action, Install):
            await self.store.install(action.head, action.entries)
            durable.reached(action.head.lsn)  # on disk (an atomic rewrite): acknowledge it
        elif isinstance(action, Append):
            self.store.append_replicated(action.records, durable.reached)

    async def _acknowledge(self, link: Link, side: FollowerStream, durable: Durable) -> None:
        """Acknowledge the last durable LSN; batches durable together cost one message."""
        sent = 0
        while True:
            await durable.changed.wait()
            durable.changed = trio.Event()
            if durable.lsn > sent:
                sent = durable.lsn
                await link.send(side.durable(sent))

    def disconnect(self, peer: str) -> None:
        """End a standby's link (it dials again, unless something keeps it from it)."""
        scope = self._links.get(peer)
        if scope is not None:
            scope.cancel()

    def status(self) -> dict[str, Any]:
        last = self.store.last()
        skip = self._skipped()
        return {
            "port": self.port,
            "followers": {
                peer: {
                    "stage": s.stage,
                    "acked": s.acked,
                    "lag": last - s.acked,
                    "counted": peer not in skip,
                    "clock_skew": None if s.skew is None else round(s.skew, 3),
                    "version": s.peer.version if s.peer else "",
                }
                for peer, s in self.followers.items()
            },
            "not_counted": sorted(skip),
            "following": dict(self.following),
            "refused": dict(self.refused),
            "problems": dict(self.problems),
        }


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
