"""The election's UDP transport at the trust boundary: no datagram stops a node.

Mutated envelopes (certificates included) go through the real ``UdpTransport``
receive path: through its socket, and straight into its per-datagram handler
for hypothesis and the long fuzzing run (``RACKBOOT_TEST_PROFILE=long``:
>= 100,000 mutated envelopes). Every one is counted under a reason and
dropped; a valid datagram afterwards is still delivered. Unknown
certificates are verified only within a per-source rate. Envelopes include
revocation lists and messages stating a list number, and members' bodies
mutated and signed again (what only a member could send) reach the decoders.

Revocation lists are sent only to addresses the node sends to anyway, at most
once a second each, and only when they stated an older list (or, when the
node's list changes, to configured members not known to have it).
"""

from __future__ import annotations

import os
import random
import socket
import time

import msgpack
import pytest
import trio
from cryptography import x509
from hypothesis import given
from hypothesis import strategies as st

from appliance.cluster import pki
from appliance.cluster.files import ClusterFiles
from appliance.ha import udp
from appliance.ha.envelope import CRL_DOMAIN, DOMAIN, MAX_DATAGRAM, seal, seal_crl
from appliance.ha.messages import Prepare
from appliance.ha.udp import UdpTransport
from appliance.ha.witness import load_identity
from tests.support.ha import enrol_members

MESSAGE = Prepare("rack1", 1, 1, "d" * 32, ["a" * 16])
SOURCE = ("127.0.0.1", 40000)
LONG = os.environ.get("RACKBOOT_TEST_PROFILE") == "long"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("members")
    other = enrol_members(tmp_path_factory.mktemp("other"), ["x"])  # another cluster
    return {**enrol_members(base, ["a", "b"]), "x": other["x"]}


@pytest.fixture(scope="module")
def members(dirs):
    return {n: load_identity(str(d)) for n, d in dirs.items()}


@pytest.fixture(scope="module")
def make_crl(dirs, members):
    """Revocation lists of the cluster's CA (``a`` holds it); enrolment issued number 1."""
    ca_key = pki.key_from_pem(ClusterFiles(dirs["a"]).read("ca.key"))
    now = pki.utc(time.time())

    def make(serials=(), number=2, random_serials=0):
        revoked = [*serials, *(x509.random_serial_number() for _ in range(random_serials))]
        return pki.make_crl(members["a"].ca, ca_key, dict.fromkeys(revoked, now), number, now)

    return make


def sealed(identity, message=MESSAGE, crl=None) -> bytes:
    return seal(message, identity.key, pki.cert_der(identity.cert), crl)


def sealed_crl(identity, crl) -> bytes:
    return seal_crl(crl.der, identity.key, pki.cert_der(identity.cert))


def mutate(rng: random.Random, datagram: bytes, key=None) -> bytes:
    """One of: flip bytes anywhere, truncate, insert; or mutate one part of the envelope
    (the certificate most often: its lazily parsed fields raised before) and re-pack; or,
    given the signer's ``key``, mutate the body and sign it again, as a member could."""
    kind = rng.randrange(7 if key is not None else 5)
    if kind >= 5:
        return resigned(rng, datagram, key, stated=kind == 6)
    data = bytearray(datagram)
    if kind == 0:
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == 1:
        return bytes(data[: rng.randrange(len(data))])
    if kind == 2:
        at = rng.randrange(len(data))
        return bytes(data[:at] + rng.randbytes(rng.randint(1, 8)) + data[at:])
    version, cert, payload, signature = msgpack.unpackb(datagram)
    part = [cert, payload, signature][0 if kind == 3 else rng.randrange(3)]
    mutated = bytearray(part)
    for _ in range(rng.randint(1, 3)):
        mutated[rng.randrange(len(mutated))] ^= rng.randrange(1, 256)
    parts = [cert, payload, signature]
    parts[parts.index(part)] = bytes(mutated)
    return msgpack.packb([version, *parts], use_bin_type=True)


ODD_VALUES = [-1, 0, 2**63, 2**64 - 1, True, None, "2", 2.0, [2], {"a": 1}, b"2", 3]


def resigned(rng: random.Random, datagram: bytes, key, *, stated: bool) -> bytes:
    """The body changed and signed again: flipped bytes (a message or a revocation list), or
    (``stated``) a message whose list number is any odd value."""
    kind, cert, body, _ = msgpack.unpackb(datagram)
    if stated and kind == 1:
        raw = msgpack.unpackb(body)
        raw["crl"] = rng.choice(ODD_VALUES)
        body = msgpack.packb(raw)
    else:
        mutated = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] ^= rng.randrange(1, 256)
        body = bytes(mutated)
    signature = key.sign((DOMAIN if kind == 1 else CRL_DOMAIN) + body)
    return msgpack.packb([kind, cert, body, signature], use_bin_type=True)


def fuzz_corpus(members, make_crl) -> list[tuple[bytes, object]]:
    """(valid datagram, its signer's key): messages stating a list number or none, and a
    newer revocation list (revoking nobody here) from ``b``, from another cluster's ``x``."""
    newer = make_crl({12345}, number=2)
    return [
        *((sealed(members[n], crl=1), members[n].key) for n in ("a", "b", "x")),
        (sealed(members["b"]), members["b"].key),
        (sealed_crl(members["b"], newer), members["b"].key),
        (sealed_crl(members["x"], newer), members["x"].key),
    ]


def transport_of(identity, deliveries: list) -> tuple[UdpTransport, callable]:
    transport = UdpTransport(identity, "127.0.0.1", 0)
    return transport, lambda sender, address, message: deliveries.append((sender, message))


def test_a_certificate_with_one_mutated_byte_is_a_counted_drop(members):
    """It raised ValueError or InvalidVersion out of the transport, and the node exited."""
    deliveries: list = []
    transport, deliver = transport_of(members["a"], deliveries)
    transport._admit = lambda host: True  # every certificate verified: the costly path
    good = sealed(members["b"])
    version, cert, payload, signature = msgpack.unpackb(good)
    for offset in range(len(cert)):
        for value in (0x00, 0xFF, cert[offset] ^ 0x01):
            broken = bytearray(cert)
            broken[offset] = value
            if bytes(broken) == cert:
                continue
            transport._open(msgpack.packb([version, bytes(broken), payload, signature]),
                            SOURCE, deliver)  # fmt: skip
    # a byte outside the signed part that still parses to the same certificate (DER's
    # outer encoding) proves the same member: never another identity
    assert {sender for sender, _ in deliveries} <= {members["b"].node_id}
    assert transport.dropped["internal"] == 0
    assert sum(transport.dropped.values()) == transport.counters["refused"] > 2 * len(cert)
    deliveries.clear()
    transport._open(good, SOURCE, deliver)
    assert [sender for sender, _ in deliveries] == [members["b"].node_id]


def handled(transport, deliveries) -> int:
    """Every datagram is delivered, received as a revocation list, or a counted drop."""
    return len(deliveries) + transport.counters["crl_received"] + transport.counters["refused"]


@given(st.randoms(use_true_random=False), st.integers(0, 5))
def test_mutated_envelopes_are_counted_and_never_raise(members, make_crl, rng, which):
    deliveries: list = []
    transport, deliver = transport_of(members["a"], deliveries)
    transport._admit = lambda host: True
    datagram, key = fuzz_corpus(members, make_crl)[which]
    transport._open(mutate(rng, datagram, key), SOURCE, deliver)
    assert handled(transport, deliveries) == 1
    assert transport.dropped["internal"] == 0


def test_a_long_run_of_mutated_envelopes(members, make_crl):
    """>= 100,000 mutated envelopes under the long profile, 3,000 in CI."""
    count = 100_000 if LONG else 3_000
    rng = random.Random(1)
    deliveries: list = []
    transport, deliver = transport_of(members["a"], deliveries)
    transport._admit = lambda host: True
    valid = fuzz_corpus(members, make_crl)
    for n in range(count):
        datagram, key = valid[n % len(valid)]
        transport._open(mutate(rng, datagram, key), SOURCE, deliver)
    assert handled(transport, deliveries) == count
    assert transport.dropped["internal"] == 0
    # a mutation outside the signed parts may still prove its signer: never anyone else
    assert all(sender in (members["a"].node_id, members["b"].node_id) for sender, _ in deliveries)
    # a list is adopted only as the CA signed it: b's, once (a mutation that still verifies
    # changed nothing the CA signed)
    assert transport.counters["crl_adopted"] <= 1
    assert transport.opener.revocations.serials in (frozenset(), frozenset({12345}))
    print({"count": count, **transport.dropped, "delivered": len(deliveries),
           "lists": transport.counters["crl_received"]})  # fmt: skip


async def test_junk_through_the_socket_then_a_valid_datagram_is_delivered(members):
    deliveries: list = []
    transport, deliver = transport_of(members["a"], deliveries)
    await transport.bind([])
    rng = random.Random(2)
    valid = sealed(members["b"])
    junk = [sealed(members["x"])] * 100 + [mutate(rng, valid) for _ in range(500)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(transport.serve, deliver)
            for n, datagram in enumerate(junk):
                sender.sendto(datagram, ("127.0.0.1", transport.port))
                if n % 50 == 0:
                    await trio.sleep(0.001)  # let the socket buffer drain
            sender.sendto(valid, ("127.0.0.1", transport.port))
            with trio.fail_after(5):
                while not deliveries:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    transport.close()
    assert [s for s, _ in deliveries][-1:] == [members["b"].node_id]
    assert {s for s, _ in deliveries} == {members["b"].node_id}
    assert transport.counters["refused"] + len(deliveries) == len(junk) + 1
    # heard (what `rackboot doctor` reads): the member whose datagram passed, nobody else
    heard = transport.heard(trio.current_time())
    assert list(heard) == [members["b"].node_id] and 0 <= heard[members["b"].node_id] < 5
    # the other cluster's certificate was checked once; its repeats cost a hash
    assert transport.dropped["certificate"] >= 100 and transport.dropped["internal"] == 0


def test_unknown_certificates_are_verified_within_a_rate_per_source(members, monkeypatch):
    monkeypatch.setattr(udp.trio, "current_time", lambda: 100.0)  # a frozen instant
    deliveries: list = []
    transport, deliver = transport_of(members["a"], deliveries)
    checked = 0
    real = udp.Opener.open_untrusted

    def counting(self, datagram, now, admit=lambda: True):
        def counted():
            nonlocal checked
            allowed = admit()
            checked += allowed
            return allowed

        return real(self, datagram, now, counted)

    monkeypatch.setattr(udp.Opener, "open_untrusted", counting)
    version, cert, payload, signature = msgpack.unpackb(sealed(members["x"]))
    started = time.process_time()
    for n in range(2000):  # each a fresh certificate (its signature bits differ): nothing cached
        fresh = cert[:-8] + n.to_bytes(8, "big")
        transport._open(msgpack.packb([version, fresh, payload, signature]), ("10.0.0.9", 1),
                        deliver)  # fmt: skip
    assert checked <= udp.SOURCE_BURST
    assert transport.dropped["rate-limited"] == 2000 - checked
    # another source still gets its certificate checked, and a known one is never limited
    transport._open(sealed(members["b"]), ("10.0.0.8", 1), deliver)
    assert len(deliveries) == 1
    print(f"{(time.process_time() - started) / 2001 * 1e6:.1f} us of CPU per junk datagram")


async def test_a_member_revoked_while_running_is_refused_from_that_moment(members, make_crl):
    """The revocation list used to be read once at start and never applied."""
    current = members["a"].revocations
    deliveries: list = []
    transport = UdpTransport(members["a"], "127.0.0.1", 0, revocations=lambda: current)
    deliver = lambda sender, address, message: deliveries.append(sender)  # noqa: E731
    datagram = sealed(members["b"])
    transport._open(datagram, SOURCE, deliver)
    assert deliveries == [members["b"].node_id]  # known and cached now
    current = make_crl({members["b"].cert.serial_number})
    transport._open(datagram, SOURCE, deliver)
    assert deliveries == [members["b"].node_id] and transport.dropped["certificate"] == 1


# -- revocation lists sent over the election port ------------------------------------


class Wire:
    """A socket that keeps what is sent: (target, kind 1 message / 2 list)."""

    def __init__(self) -> None:
        self.sent: list[tuple[tuple[str, int], int]] = []

    def sendto(self, data: bytes, target) -> None:
        assert len(data) <= MAX_DATAGRAM
        self.sent.append((target, msgpack.unpackb(data)[0]))

    def take(self) -> list:
        sent, self.sent = self.sent, []
        return sent


def transport_with(identity, crl, *, configured=()) -> UdpTransport:
    """A transport whose node knows ``crl`` (a cell: ``crl[0]``), sending into a :class:`Wire`."""
    transport = UdpTransport(identity, "127.0.0.1", 0, revocations=lambda: crl[0])
    transport.sock = Wire()  # type: ignore[assignment]
    transport._sync()  # the list it starts with is not news
    transport._resolved = {f"{h}:{p}": (h, p) for h, p in configured}
    return transport


def nothing(sender, address, message) -> None:
    pass


async def test_a_list_goes_only_where_a_datagram_goes_that_stated_an_older_one(
    members, make_crl, autojump_clock
):
    transport = transport_with(members["a"], [make_crl(number=3)])
    wire = transport.sock
    b = ("10.0.0.2", 7471)
    transport.send("10.0.0.2:7471", MESSAGE)  # never heard from: it may run an older version
    assert wire.take() == [(b, 1)]
    transport._open(sealed(members["b"]), b, nothing)  # an older version: states no number
    transport.send("10.0.0.2:7471", MESSAGE)
    assert wire.take() == [(b, 1)]
    transport._open(sealed(members["b"], crl=2), b, nothing)
    assert wire.take() == []  # a datagram stating an older list is never answered by itself
    transport.send("10.0.0.2:7471", MESSAGE)
    assert wire.take() == [(b, 2), (b, 1)]  # the list first: what follows is judged by it
    transport._open(sealed(members["b"], crl=3), b, nothing)
    transport.send("10.0.0.2:7471", MESSAGE)
    assert wire.take() == [(b, 1)]
    assert transport.counters["crl_sent"] == 1 and transport.counters["sent"] == 4


async def test_one_list_per_address_per_second_and_a_global_rate(members, make_crl, autojump_clock):
    """A replayed old datagram from a spoofed source cannot make the port an amplifier."""
    transport = transport_with(members["a"], [make_crl(number=3)])
    wire = transport.sock
    b = ("10.0.0.2", 7471)
    transport._open(sealed(members["b"], crl=2), b, nothing)
    for _ in range(10):  # a holder's renewals: prepare and propose, four rounds a second
        transport.send("10.0.0.2:7471", MESSAGE)
        await trio.sleep(0.125)
    transport.send("10.0.0.2:7471", MESSAGE)  # 1.25 s after the first
    lists = [n for n, (_, kind) in enumerate(wire.take()) if kind == 2]
    assert lists == [0, 9]  # one at once, the next with the send a second later
    # many destinations at one instant: PUSH_BURST lists, then counted refusals
    for n in range(40):
        source = (f"10.1.0.{n}", 7471)
        transport._open(sealed(members["b"], crl=2), source, nothing)
        transport.send(f"10.1.0.{n}:7471", MESSAGE)
    assert sum(kind == 2 for _, kind in wire.take()) == udp.PUSH_BURST
    assert transport.counters["crl_limited"] == 40 - udp.PUSH_BURST
    await trio.sleep(1.0)
    transport.send("10.1.0.39:7471", MESSAGE)
    assert wire.take()[0] == (("10.1.0.39", 7471), 2)


async def test_a_list_too_large_for_a_datagram_is_counted_and_logged_never_sent(
    members, make_crl, autojump_clock, caplog
):
    large = make_crl(number=3, random_serials=100)
    transport = transport_with(members["a"], [large])
    wire = transport.sock
    b = ("10.0.0.2", 7471)
    transport._open(sealed(members["b"], crl=2), b, nothing)
    for _ in range(3):
        transport.send("10.0.0.2:7471", MESSAGE)
        await trio.sleep(1.0)
    assert wire.take() == [(b, 1)] * 3  # the election goes on
    assert transport.counters["crl_too_large"] == 1 and transport.counters["crl_sent"] == 0
    assert caplog.text.count("revocation list too large") == 1


async def test_a_changed_list_is_offered_at_once_to_every_configured_member(
    members, make_crl, autojump_clock
):
    """Whatever they stated (a number is only as fresh as its datagram), except a member
    running a version without revocation lists; once per change."""
    crl = [make_crl(number=2)]
    peer, witness, current, old = (("10.0.0.2", 7471), ("10.9.0.5", 7471),
                                   ("10.0.0.3", 7471), ("10.0.0.4", 7471))  # fmt: skip
    transport = transport_with(members["a"], crl, configured=[peer, witness, current, old])
    wire = transport.sock
    assert wire.take() == []  # the list it started with is not news
    transport._open(sealed(members["b"], crl=1), peer, nothing)
    transport._open(sealed(members["b"], crl=3), current, nothing)
    transport._open(sealed(members["b"]), old, nothing)
    crl[0] = make_crl(number=3)  # e.g. the cluster service adopted it from a TLS peer
    transport._sync()
    assert sorted(wire.take()) == [(peer, 2), (current, 2), (witness, 2)]
    transport._sync()
    assert wire.take() == []  # once per change


async def test_a_list_learnt_from_a_datagram_is_in_force_and_handed_on(
    members, make_crl, autojump_clock
):
    """An appliance's transport uses a newer list a witness or peer sent even while its
    cluster service still has the older one, and hands the list to it."""
    handed: list = []
    old = members["a"].revocations
    transport = UdpTransport(members["a"], "127.0.0.1", 0, revocations=lambda: old,
                             adopt=handed.append)  # fmt: skip
    transport.sock = Wire()  # type: ignore[assignment]
    deliveries: list = []
    deliver = lambda sender, address, message: deliveries.append(sender)  # noqa: E731
    transport._open(sealed(members["b"], crl=1), SOURCE, deliver)
    newer = make_crl({members["b"].cert.serial_number}, number=2)
    transport._open(sealed_crl(members["b"], newer), SOURCE, deliver)
    assert handed == [newer] and transport.counters["crl_adopted"] == 1
    transport._open(sealed(members["b"], crl=1), SOURCE, deliver)
    assert deliveries == [members["b"].node_id] and transport.dropped["certificate"] == 1
    transport._open(sealed_crl(members["a"], make_crl(number=1)), SOURCE, deliver)
    assert handed == [newer] and transport.counters["crl_received"] == 2  # older: kept ours
    assert transport.opener.revocations == newer


async def test_a_forged_or_garbled_list_is_a_counted_drop(members, make_crl, autojump_clock):
    handed: list = []
    transport = UdpTransport(members["a"], "127.0.0.1", 0, adopt=handed.append)
    impostor_key = pki.new_key()
    impostor = pki.make_ca(impostor_key, members["a"].cluster_id, pki.utc(time.time()))
    forged = pki.make_crl(impostor, impostor_key, {1: pki.utc(time.time())}, 99,
                          pki.utc(time.time()))  # fmt: skip
    garbled = pki.Revocations(99, frozenset(), make_crl(number=99).der[:-3] + b"xyz")
    for crl in (forged, garbled, pki.Revocations(99, frozenset(), b"\x30\x03\x02\x01\x05")):
        transport._open(sealed_crl(members["b"], crl), SOURCE, nothing)
    assert transport.dropped["revocation-list"] == 3 and transport.dropped["internal"] == 0
    assert handed == [] and transport.opener.revocations.number == 1
