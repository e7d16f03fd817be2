"""The election's UDP transport at the trust boundary: no datagram stops a node.

Mutated envelopes (certificates included) go through the real ``UdpTransport``
receive path: through its socket, and straight into its per-datagram handler
for hypothesis and the long fuzzing run (``RACKBOOT_TEST_PROFILE=long``:
>= 100,000 mutated envelopes). Every one is counted under a reason and
dropped; a valid datagram afterwards is still delivered. Unknown
certificates are verified only within a per-source rate.
"""

from __future__ import annotations

import os
import random
import socket
import time

import msgpack
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from appliance.cluster import pki
from appliance.ha import udp
from appliance.ha.envelope import seal
from appliance.ha.messages import Prepare
from appliance.ha.udp import UdpTransport
from appliance.ha.witness import load_identity
from tests.support.ha import enrol_members

MESSAGE = Prepare("rack1", 1, 1, "d" * 32, ["a" * 16])
SOURCE = ("127.0.0.1", 40000)
LONG = os.environ.get("RACKBOOT_TEST_PROFILE") == "long"


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    base = tmp_path_factory.mktemp("members")
    dirs = enrol_members(base, ["a", "b"])
    other = enrol_members(tmp_path_factory.mktemp("other"), ["x"])  # another cluster
    return {n: load_identity(str(d)) for n, d in {**dirs, "x": other["x"]}.items()}


def sealed(identity, message=MESSAGE) -> bytes:
    return seal(message, identity.key, pki.cert_der(identity.cert))


def mutate(rng: random.Random, datagram: bytes) -> bytes:
    """One of: flip bytes anywhere, truncate, insert; or mutate one part of the envelope
    (the certificate most often: its lazily parsed fields raised before) and re-pack."""
    kind = rng.randrange(5)
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


@given(st.randoms(use_true_random=False), st.sampled_from(["a", "b", "x"]))
def test_mutated_envelopes_are_counted_and_never_raise(members, rng, signer):
    deliveries: list = []
    transport, deliver = transport_of(members["a"], deliveries)
    transport._admit = lambda host: True
    junk = mutate(rng, sealed(members[signer]))
    transport._open(junk, SOURCE, deliver)
    assert len(deliveries) + transport.counters["refused"] == 1
    assert transport.dropped["internal"] == 0


def test_a_long_run_of_mutated_envelopes(members):
    """>= 100,000 mutated envelopes under the long profile, 3,000 in CI."""
    count = 100_000 if LONG else 3_000
    rng = random.Random(1)
    deliveries: list = []
    transport, deliver = transport_of(members["a"], deliveries)
    transport._admit = lambda host: True
    valid = [sealed(members[n]) for n in ("a", "b", "x")]
    for n in range(count):
        transport._open(mutate(rng, valid[n % 3]), SOURCE, deliver)
    assert len(deliveries) + transport.counters["refused"] == count
    assert transport.dropped["internal"] == 0
    # a mutation outside the signed parts may still prove its signer: never anyone else
    assert all(sender in (members["a"].node_id, members["b"].node_id) for sender, _ in deliveries)
    print({"count": count, **transport.dropped, "delivered": len(deliveries)})


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


async def test_a_member_revoked_while_running_is_refused_from_that_moment(members):
    """The revocation list used to be read once at start and never applied."""
    revoked: frozenset[int] = frozenset()
    deliveries: list = []
    transport = UdpTransport(members["a"], "127.0.0.1", 0, revoked=lambda: revoked)
    deliver = lambda sender, address, message: deliveries.append(sender)  # noqa: E731
    datagram = sealed(members["b"])
    transport._open(datagram, SOURCE, deliver)
    assert deliveries == [members["b"].node_id]  # known and cached now
    revoked = frozenset({members["b"].cert.serial_number})
    transport._open(datagram, SOURCE, deliver)
    assert deliveries == [members["b"].node_id] and transport.dropped["certificate"] == 1
