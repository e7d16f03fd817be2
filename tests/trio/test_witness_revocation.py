"""A member removed with `rackboot cluster remove` gets no vote from the witness either.

The witness runs no cluster service: it learns a newer revocation list from
the rack's appliances over the election port. Here a witness started with the
old list, and two appliances over loopback UDP with real certificates: ``r``
holds the lease, ``a`` is the standby. The CA revokes ``r`` and only ``a``
gets the new list (as its cluster service would). From ``a``'s next datagram
to the witness on, the witness refuses ``r``'s requests (no promise, no
acceptance), ``r`` loses the lease and never gets it back, and ``a`` takes it.
The witness keeps the list on disk, so a restart does not forget the removal.
All on the autojump clock.
"""

from __future__ import annotations

import random
import time
from contextlib import asynccontextmanager
from pathlib import Path

import msgpack
import trio

from appliance.cluster import pki
from appliance.cluster.files import ClusterFiles
from appliance.ha.election import Election
from appliance.ha.membership import Members
from appliance.ha.proposer import Acquired, Lost
from appliance.ha.runner import ElectionRunner, TrioClock
from appliance.ha.schema import Timing
from appliance.ha.udp import CHECK_EVERY, UdpTransport
from appliance.ha.witness import Witness, load_identity
from tests.support.ha import enrol_members, free_udp_ports
from tests.trio.test_ha import node_running

LEASE = Timing().lease


class Appliance:
    """An appliance's election over its real UDP transport, without the rest of a node.
    ``crl`` stands for its cluster service's newest revocation list."""

    def __init__(self, identity, port: int, peers: dict, witnesses: dict, **kw) -> None:
        self.identity = identity
        self.crl = identity.revocations
        members = Members.of(identity.node_id, peers, witnesses)
        self.election = Election(
            identity.node_id, "rack1", Timing(), peers=peers, witnesses=witnesses,
            now=trio.current_time(), known_epoch=0, incarnation=1,
            rng=random.Random(identity.node_id), confirmed=members.digest, **kw,
        )  # fmt: skip
        self.transport = UdpTransport(identity, "127.0.0.1", port, revocations=lambda: self.crl)
        self.events: list = []
        self.runner = ElectionRunner(
            self.election, self.transport.send, clock=TrioClock(),
            on_event=lambda e: self.events.append((trio.current_time(), e)), persist=_nothing,
        )  # fmt: skip

    async def run(self, addresses: list[str], *, task_status=trio.TASK_STATUS_IGNORED):
        await self.transport.bind(addresses)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.transport.serve, self.runner.deliver)
            await nursery.start(self.runner.run)
            task_status.started()

    def holding(self) -> bool:
        return self.election.holding(trio.current_time())

    def acquired_since(self, when: float) -> int:
        return sum(isinstance(e, Acquired) and at >= when for at, e in self.events)


async def _nothing(epoch: int) -> None:
    pass


def record_sends(transport: UdpTransport) -> list:
    """(time, target, kind: 1 message, 2 revocation list) of every datagram it sends."""
    sent: list = []
    real = transport._sendto

    def recording(datagram, target, counter):
        sent.append((trio.current_time(), target, msgpack.unpackb(datagram)[0]))
        real(datagram, target, counter)

    transport._sendto = recording  # type: ignore[method-assign]
    return sent


async def until(predicate, timeout: float, step: float = 0.005) -> None:
    """Poll on the mock clock; fail after ``timeout`` mock seconds."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(step)


@asynccontextmanager
async def rack(tmp_path: Path):
    dirs = enrol_members(tmp_path, ["a", "r", "w"])  # a holds the CA
    ids = {n: load_identity(str(d)) for n, d in dirs.items()}
    ports = dict(zip("arw", free_udp_ports(3), strict=True))
    address = {n: f"127.0.0.1:{ports[n]}" for n in "arw"}
    witness = Witness(ids["w"], "127.0.0.1", ports["w"], LEASE)
    nodes = {}
    for name, other in (("a", "r"), ("r", "a")):
        nodes[name] = Appliance(
            ids[name], ports[name], {ids[other].node_id: address[other]},
            {ids["w"].node_id: address["w"]}, maintenance=name == "a",  # r takes the lease
        )  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: witness.run(handle_signals=False,
                                                            task_status=task_status))  # fmt: skip
        for name, other in (("a", "r"), ("r", "a")):
            await nursery.start(nodes[name].run, [address[other], address["w"]])
        yield nodes, witness, dirs
        nursery.cancel_scope.cancel()


def crl_ca(dirs):
    return load_identity(str(dirs["a"])).ca


def revoke(dirs, name: str) -> pki.Revocations:
    """What `rackboot cluster remove NAME` makes on the CA holder: the next list."""
    files = ClusterFiles(dirs["a"])
    ca = crl_ca(dirs)
    ca_key = pki.key_from_pem(files.read("ca.key"))
    old = pki.crl_from_der_untrusted(files.read("crl.der"), ca)
    serial = load_identity(str(dirs[name])).cert.serial_number
    now = pki.utc(time.time())
    return pki.make_crl(ca, ca_key, {serial: now}, old.number + 1, now)


async def test_the_witness_refuses_a_revoked_member_from_an_appliances_next_datagram(
    tmp_path, autojump_clock
):
    async with rack(tmp_path) as (nodes, witness, dirs):
        a, r = nodes["a"], nodes["r"]
        await until(r.holding, timeout=5)
        a.election.set_maintenance(False, trio.current_time())  # a: a standby told "busy"
        a.runner.poke()
        await trio.sleep(2 * LEASE)
        assert r.holding() and not a.holding() and witness.revocation_list == 1
        w_address = ("127.0.0.1", witness.transport.port)
        r_address = ("127.0.0.1", r.transport.port)
        a_sent, w_sent = record_sends(a.transport), record_sends(witness.transport)
        refused_before = witness.transport.dropped["certificate"]

        a.crl = crl = revoke(dirs, "r")  # only a's cluster service has the new list
        revoked_at = trio.current_time()
        await until(lambda: witness.revocation_list == crl.number, timeout=1, step=0.001)
        learnt_at = trio.current_time()

        # a's next datagram to the witness was the list, within a renewal of a having it
        to_witness = [(at, kind) for at, target, kind in a_sent if target == w_address]
        assert to_witness[0][1] == 2 and to_witness[0][0] - revoked_at <= CHECK_EVERY
        assert learnt_at - revoked_at <= CHECK_EVERY + 0.01
        assert witness.transport.counters["crl_adopted"] == 1

        await trio.sleep(4 * LEASE)
        # r kept asking; from then on the witness refused it: not one answer went to r
        assert witness.transport.dropped["certificate"] > refused_before
        assert [at for at, target, _ in w_sent if target == r_address and at >= learnt_at] == []
        assert r.acquired_since(revoked_at) == 0 and not r.holding()
        assert any(isinstance(e, Lost) and at >= revoked_at for at, e in r.events)
        assert a.holding()  # the witness and a: a majority without r
        # the list went to the witness once: it stated the new number from then on
        assert sum(kind == 2 for _, target, kind in a_sent if target == w_address) == 1

    # kept on disk (atomically, beside its certificate): a restart does not forget it
    kept = ClusterFiles(dirs["w"]).read("crl.der")
    assert pki.crl_from_der_untrusted(kept, crl_ca(dirs)).number == crl.number
    restarted = Witness(load_identity(str(dirs["w"])), "127.0.0.1", 0, LEASE)
    assert restarted.revocation_list == crl.number


async def test_an_appliance_learns_a_newer_list_from_the_witness_and_its_cluster_keeps_it(
    tmp_path,
):
    """Real nodes (real clock, every wait bounded): the witness was given a newer list;
    answering the appliances' requests it sends it, their transports hand it to their
    cluster services, which adopt it and write crl.der."""
    from tests.trio.test_cluster import wait_until

    dirs = enrol_members(tmp_path, ["a", "b", "w"])
    ca = crl_ca(dirs)
    ca_key = pki.key_from_pem(ClusterFiles(dirs["a"]).read("ca.key"))
    now = pki.utc(time.time())
    newer = pki.make_crl(ca, ca_key, {12345: now}, 2, now)  # revokes nobody running here
    ClusterFiles(dirs["w"]).write("crl.der", newer.der, 0o644)
    ports = dict(zip("abw", free_udp_ports(3), strict=True))
    ids = {n: load_identity(str(d)).node_id for n, d in dirs.items()}
    addr = {n: f"{ids[n]}@127.0.0.1:{ports[n]}" for n in "abw"}
    witness = Witness(load_identity(str(dirs["w"])), "127.0.0.1", ports["w"], LEASE)
    assert witness.revocation_list == 2
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: witness.run(handle_signals=False,
                                                            task_status=task_status))  # fmt: skip
        ha_a = {"port": ports["a"], "peers": [addr["b"]], "witnesses": [addr["w"]]}
        ha_b = {"port": ports["b"], "peers": [addr["a"]], "witnesses": [addr["w"]]}
        async with node_running(dirs["a"], "a", ha_a) as a, node_running(dirs["b"], "b", ha_b) as b:
            nodes = (a, b)
            await wait_until(
                lambda: all(n.cluster.identity.revocations.number == 2 for n in nodes),
                timeout=5, what="both appliances on list 2",
            )  # fmt: skip
            # only the witness had it: at least one of them learnt it over the election port
            assert sum(n.ha.transport.counters["crl_adopted"] for n in nodes) >= 1
            await wait_until(
                lambda: all(
                    pki.crl_from_der_untrusted(ClusterFiles(dirs[n]).read("crl.der"), ca).number
                    == 2 for n in "ab"
                ), timeout=5, what="crl.der written",
            )  # fmt: skip
        nursery.cancel_scope.cancel()
