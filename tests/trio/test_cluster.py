"""The cluster over real loopback TLS (real clock, every test bounded), and the session pump
on the autojump clock: enrolment, links, restarts, and everything that must be refused."""

from __future__ import annotations

import logging
import ssl
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from appliance import __version__
from appliance.cluster import authority, pki, wire
from appliance.cluster.files import ClusterFiles
from appliance.cluster.service import join_cluster
from appliance.cluster.session import Established, LocalInfo, Session
from appliance.cluster.transport import Pump, client_context
from appliance.errors import RackbootError
from appliance.node import Node
from tests.support.plugins import configured

FAST = {"port": 0, "keepalive": 0.1, "dead_after": 0.6, "connect_timeout": 2.0, "backoff_max": 0.3}


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, str, dict]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", {})
        self.records.append((record.levelname.lower(), record.getMessage(), fields))

    def find(self, msg: str, text: str = "") -> list[dict]:
        return [f for _, m, f in self.records if m == msg and text in str(f)]


@pytest.fixture
def logs():
    handler = Records()
    root = logging.getLogger("rackboot")
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old)


async def wait_until(predicate, timeout: float = 10.0, what: str = "") -> None:
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.02)
        return
    pytest.fail(f"timed out after {timeout} s waiting for {what or predicate}")


@asynccontextmanager
async def running(path: Path, name: str, speaks=None, **cluster):
    """A node in its own cancel scope, stopped (gracefully) on exit or by ``node.request_stop``;
    ``speaks``: the version and protocols it states (appliance/compat.py)."""
    config, pm = configured(
        path, {"node": {"name": name, "data_dir": str(path / name)}, "cluster": {**FAST, **cluster}}
    )
    node = Node(config, pm)
    node.speaks = speaks or node.speaks
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        yield node
        node.request_stop("test over")


def site(node: Node) -> dict[str, dict]:
    return {row["name"]: row for row in node.cluster.status().get("site", [])}


def online(node: Node, *names: str) -> bool:
    rows = site(node)
    return all(rows.get(n, {}).get("health") == "online" for n in names)


async def test_init_join_link_status_and_restart(tmp_path, logs):
    with trio.fail_after(30):
        async with running(tmp_path, "alpha") as a:
            assert a.cluster.status() == {"state": "not a member"}
            made = await a.cluster.cmd_init({})
            assert made["token"].startswith("rbj1.") and a.cluster.identity.is_ca
            async with running(tmp_path, "beta") as b:
                joined = await b.cluster.cmd_join({"token": made["token"]})
                assert joined["cluster_id"] == made["cluster_id"]
                await wait_until(lambda: online(a, "beta") and online(b, "alpha"), what="link up")
                row = site(a)["beta"]
                assert row["rack"] == "rack1" and row["role"] == "active" and row["version"]
                assert row["address"].startswith("127.0.0.1:") and row["last_seen_ago"] < 1.0
                assert site(a)["alpha"]["self"] is True
                # the keepalives measure the peer's wall clock (one machine here: no skew)
                await wait_until(lambda: site(a)["beta"]["clock_skew"] is not None, what="skew")
                assert abs(site(a)["beta"]["clock_skew"]) < 0.5
                status = a.status()["core"]["cluster"]
                assert status["ca_holder"] and status["state"] == "member" and status["links"] >= 1
            # beta stopped: alpha notices within dead_after and shows it offline.
            await wait_until(lambda: site(a)["beta"]["health"] == "offline", what="beta offline")
            assert logs.find("peer down", "beta")
            # beta restarts from its files (no token needed): the link comes back.
            async with running(tmp_path, "beta") as b:
                await wait_until(lambda: online(a, "beta") and online(b, "alpha"), what="relink")
                assert b.cluster.identity.node_id == joined["node_id"]
            files = ClusterFiles(tmp_path / "beta")
            assert files.path("node.key").stat().st_mode & 0o777 == 0o600
            assert ClusterFiles(tmp_path / "alpha").path("ca.key").stat().st_mode & 0o777 == 0o600
            assert not files.exists("ca.key")  # the CA key never leaves the node that made it


async def test_removed_node_is_refused_by_every_member(tmp_path, logs):
    with trio.fail_after(30):
        async with running(tmp_path, "alpha") as a:
            token = (await a.cluster.cmd_init({}))["token"]
            async with running(tmp_path, "beta") as b, running(tmp_path, "gamma") as c:
                await b.cluster.cmd_join({"token": token})
                await c.cluster.cmd_join({"token": (await a.cluster.cmd_token({}))["token"]})
                # gamma learns beta from alpha's... no: from beta's hello when beta dials it?
                # Neither knows the other's address without mDNS: give gamma beta's address.
                c.cluster.table.add_static(b.cluster.advertised()[0])
                c.cluster._dial_wake.set()
                await wait_until(lambda: online(a, "beta", "gamma") and online(c, "beta"))
                gone = await a.cluster.cmd_remove({"node": "beta"})
                assert gone["crl"] == 2
                # The new revocation list reaches gamma over its link to alpha...
                await wait_until(lambda: c.cluster.identity.revocations.number == 2, what="crl")
                # ...and every member drops and refuses beta from then on.
                await wait_until(lambda: not online(a, "beta") and not online(c, "beta"))
                await wait_until(lambda: logs.find("refused peer", "is revoked"), what="refusal")
                assert b.cluster.status()["state"] == "member"  # beta still runs: no crash
                await trio.sleep(1.0)
                assert not online(a, "beta") and not online(c, "beta") and online(c, "alpha")
            crl = ClusterFiles(tmp_path / "gamma").read("crl.der")
            assert pki.crl_from_der_untrusted(crl, c.cluster.identity.ca).number == 2


async def raw_tls(port: int, ctx: ssl.SSLContext) -> trio.SSLStream:
    stream = trio.SSLStream(
        await trio.open_tcp_stream("127.0.0.1", port), ctx, server_hostname=None
    )
    await stream.do_handshake()
    return stream


async def read_all(stream: trio.SSLStream) -> bytes:
    data = b""
    with trio.move_on_after(3):
        try:
            while chunk := await stream.receive_some(65536):
                data += chunk
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    return data


def no_verify(ctx: ssl.SSLContext) -> ssl.SSLContext:
    ctx.verify_mode = ssl.CERT_NONE  # an intruder does not care who the server is
    return ctx


async def test_strangers_are_refused_and_the_node_carries_on(tmp_path, logs):
    with trio.fail_after(40):
        async with running(tmp_path, "alpha") as a:
            await a.cluster.cmd_init({})
            port = a.cluster.port
            # A real member identity, enrolled through alpha (no node needed for it).
            member = ClusterFiles(tmp_path / "member")
            token = (await a.cluster.cmd_token({}))["token"]
            ident = await join_cluster(member, token, "member", "rack1")

            # 1. An unenrolled node: TLS without a certificate, then a peer hello.
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            stream = await raw_tls(port, ctx)
            local = LocalInfo("0" * 16, "1" * 16, "x", "r", "standby", "0", "")
            await stream.send_all(Session(local, 0, expected_node=None).data_to_send())
            [reply] = wire.FrameReader().feed(await read_all(stream))
            assert reply["t"] == "refuse" and "presented no certificate" in reply["reason"]
            assert logs.find("refused peer", "not enrolled")

            # 2. A node of another cluster.
            other = authority.init_cluster(ClusterFiles(tmp_path / "other"), "other", trio_time())
            with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):
                stream = await raw_tls(port, no_verify(client_context(other)))
                await stream.send_all(b"\0\0\0\1\x80")
                if not await stream.receive_some(100):
                    raise trio.BrokenResourceError("closed")
            await wait_until(lambda: logs.find("refused connection", "CERTIFICATE_VERIFY_FAILED"))

            # 3. A tampered certificate: the member's, claiming another node id.
            pem = ident.cert_path.read_bytes()
            der = bytearray(pki.cert_der(ident.cert))
            at = der.find(ident.node_id.encode())
            der[at] ^= 0x01
            tampered = tmp_path / "tampered.crt"
            tampered.write_bytes(pki.cert_pem(x509_load(bytes(der))))
            assert tampered.read_bytes() != pem
            ctx = no_verify(client_context(ident))
            ctx.load_cert_chain(tampered, ident.key_path)
            logs.records.clear()
            with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):
                stream = await raw_tls(port, ctx)
                await stream.send_all(b"\0\0\0\1\x80")
                if not await stream.receive_some(100):
                    raise trio.BrokenResourceError("closed")
            await wait_until(lambda: logs.find("refused connection", "CERTIFICATE_VERIFY_FAILED"))

            # 4. An oversized message from a real member: refused before it is read.
            stream = await raw_tls(port, client_context(ident))
            await stream.send_all(wire.HEADER.pack(64 * 1024 * 1024) + b"x" * 1000)
            await read_all(stream)
            await wait_until(lambda: logs.find("refused peer", "the cap is"), what="cap refusal")

            # 5. An incompatible version: each end refuses with a message naming both. (The
            # server's `refuse` may be lost if the socket is torn down first; its own hello
            # lets the peer reach the same verdict on its own.)
            stream = await raw_tls(port, client_context(ident))
            future = LocalInfo(
                ident.cluster_id, ident.node_id, "member", "rack1", "standby", "9.9.9", "",
                proto_min=7, proto_max=8,
            )  # fmt: skip
            session = Session(future, 0, expected_node=None)
            await stream.send_all(session.data_to_send())
            session.receive_data(await read_all(stream) or b"", 1.0)
            assert session.closed.refused or session.closed.refused_by_peer
            await wait_until(lambda: logs.find("refused peer", "9.9.9"), what="version refusal")
            for reason in (session.closed.reason, logs.find("refused peer", "9.9.9")[0]["reason"]):
                assert "rackboot 9.9.9 (cluster protocol 7-8)" in reason
                assert f"rackboot {__version__} (cluster protocol 1-2)" in reason

            # After all that, alpha still serves and the member connects normally.
            assert a.cluster.status()["state"] == "member"
            stream = await raw_tls(port, client_context(ident))
            me = LocalInfo(ident.cluster_id, ident.node_id, "member", "rack1", "standby", "1", "")
            session = Session(me, trio.current_time(), expected_node=None)
            await stream.send_all(session.data_to_send())
            with trio.move_on_after(3):
                while not session.established:
                    session.receive_data(await stream.receive_some(65536), trio.current_time())
            assert session.established and session.peer.name == "alpha"
            await stream.aclose()
            assert a.cluster.counters["refused"] >= 4
            import prometheus_client

            text = prometheus_client.generate_latest(a.metrics).decode()
            assert 'rackboot_cluster_events_total{event="refused"}' in text
            assert 'rackboot_cluster_peers{state="up"}' in text


async def test_join_refusals(tmp_path):
    with trio.fail_after(30):
        async with running(tmp_path, "alpha") as a:
            token = (await a.cluster.cmd_init({}))["token"]
            await join_cluster(ClusterFiles(tmp_path / "one"), token, "one", "r")
            with pytest.raises(RackbootError, match="already used"):
                await join_cluster(ClusterFiles(tmp_path / "two"), token, "two", "r")
            with pytest.raises(RackbootError, match="already node"):
                await join_cluster(ClusterFiles(tmp_path / "one"), token, "one", "r")
            # A token pinning another CA: the member is not the cluster in the token.
            from appliance.cluster.jointoken import decode_untrusted

            good = decode_untrusted((await a.cluster.cmd_token({}))["token"], trio_time())
            forged = type(good)(**{**good.__dict__, "ca_sha256": bytes(32)}).encode()
            with pytest.raises(RackbootError, match="not the cluster in the token"):
                await join_cluster(ClusterFiles(tmp_path / "three"), forged, "three", "r")
            with pytest.raises(RackbootError, match="not a rackboot join token"):
                await join_cluster(ClusterFiles(tmp_path / "four"), "hello", "four", "r")
            assert not ClusterFiles(tmp_path / "three").enrolled()


def trio_time() -> float:
    import time

    return time.time()


def x509_load(der: bytes):
    from cryptography import x509

    return x509.load_der_x509_certificate(der)


# -- the pump on the autojump clock ------------------------------------------------

A = LocalInfo("c" * 16, "a" * 16, "alpha", "r1", "active", "1.0", "")
B = LocalInfo("c" * 16, "b" * 16, "beta", "r1", "standby", "1.0", "")


async def test_pump_keeps_a_link_alive_and_notices_the_peer_leave(autojump_clock):
    left, right = trio.testing.memory_stream_pair()
    seen: list = []
    sa = Session(A, trio.current_time(), expected_node=B.node_id, keepalive=1.0, dead_after=3.0)
    sb = Session(B, trio.current_time(), expected_node=A.node_id, keepalive=1.0, dead_after=3.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Pump(left, sa, seen.append).run)
        with trio.move_on_after(10.5):
            await Pump(right, sb, lambda e: None).run()
        assert sb.closed is None  # 10 s of keepalives: nobody was dropped for silence
        assert sa.pings == 10 and sb.pings == 10 and sa.rtt is not None
        with trio.fail_after(1):  # beta's pump closed its end: alpha sees it at once
            while sa.closed is None:
                await trio.sleep(0.01)
    assert isinstance(seen[0], Established) and seen[-1] == sa.closed
    assert sa.closed.reason.startswith(("peer closed", "connection lost"))


async def test_pump_drops_a_silent_peer_after_dead_after(autojump_clock):
    left, right = trio.testing.memory_stream_pair()
    sa = Session(A, trio.current_time(), expected_node=B.node_id, keepalive=1.0, dead_after=3.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Pump(left, sa, lambda e: None).run)
        hello = Session(B, 0, expected_node=None).data_to_send()
        await right.send_all(hello)  # says hello, then never another word
        start = trio.current_time()

        async def drain():
            while await right.receive_some(65536):
                pass

        nursery.start_soon(drain)
        while sa.closed is None:
            await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    assert sa.closed.reason == "no keepalive from peer for 3 s"
    assert 3.0 <= trio.current_time() - start <= 3.5


async def test_pump_refuses_an_oversized_message_without_reading_it(autojump_clock):
    left, right = trio.testing.memory_stream_pair()
    sa = Session(A, trio.current_time(), expected_node=None, max_message=4096)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Pump(left, sa, lambda e: None).run)
        await right.send_all(wire.HEADER.pack(10_000_000))
        with trio.fail_after(1):
            while sa.closed is None:
                await trio.sleep(0.01)
    assert sa.closed.garbage and "cap is 4096" in sa.closed.reason


async def test_a_peer_known_by_two_addresses_is_one_row_and_goes_offline(tmp_path):
    """beta knows alpha as its enrolling member (127.0.0.1:port) and as a static peer
    (localhost:port): both links prove the same node id and merge into one entry, which
    goes offline when alpha stops (not left "up" by the link that merged away)."""
    with trio.fail_after(30):
        async with running(tmp_path, "alpha") as a:
            token = (await a.cluster.cmd_init({}))["token"]
            port = a.cluster.port
            async with running(tmp_path, "beta", peers=[f"localhost:{port}"]) as b:
                await b.cluster.cmd_join({"token": token})
                await wait_until(lambda: online(b, "alpha"), what="link up")
                await trio.sleep(0.5)  # both addresses dialled by now
                rows = [r for r in b.cluster.status()["site"] if r["name"] == "alpha"]
                assert len(rows) == 1
                a.request_stop("test")
                await wait_until(lambda: site(b)["alpha"]["health"] == "offline", what="offline")
                await trio.sleep(0.5)
                assert site(b)["alpha"]["health"] == "offline"
