"""Membership is checked, not counted: node ids and the digest of the acceptor set
(explicit time, the harness network)."""

from __future__ import annotations

from appliance.ha.membership import Members
from tests.unit.ha.harness import Net


def run_checking(net: Net, until: float, step: float = 0.01) -> set[str]:
    """Run to ``until``; never two holders at any step. Who held at some point."""
    held: set[str] = set()
    while net.now < until:
        net.run_until(net.now + step)
        holders = net.holders()
        assert len(holders) <= 1, f"two holders at {net.now:.2f}: {holders}"
        held |= set(holders)
    return held


def test_the_digest_names_the_members_not_their_count():
    one = Members.of("a", ["b"], ["w1"])
    assert one.digest == Members.of("a", ["b"], ["w1"]).digest
    assert one.digest == Members.of("b", ["a"], ["w1"]).digest  # the same rack, seen from b
    assert one.digest != Members.of("a", ["b"], ["w2"]).digest
    assert one.digest != Members.of("a", ["b"], ["w1"], split_brain_opt_in=True).digest


def test_a_witness_swapped_on_one_side_never_gives_two_holders():
    """Same count, other members: each side had a majority of its own (a with w1, b with w2)
    and both held after a hand-over and a partition."""
    net = Net()
    net.add_witness("w1")
    net.add_witness("w2")
    net.add_node("a", ["b"], ["w1"])
    net.add_node("b", ["a"], ["w2"])
    held = run_checking(net, 3.0)
    net.nodes["b"].promote(net.now)
    net._flush("b")
    held |= run_checking(net, 4.0)
    net.partition("a", "b")
    held |= run_checking(net, 8.0)
    assert held == set()
    for name, other in (("a", "b"), ("b", "a")):
        status = net.nodes[name].status(net.now)
        assert status["membership"]["blocked"] == "mismatch"
        assert status["membership"]["peers"][other] == net.nodes[other].members.digest
        assert status["acceptor"]["mismatched"] == {other: net.nodes[other].members.digest}


def test_a_changed_membership_waits_to_be_seen_on_the_other_appliance():
    net = Net()
    net.rack("a", "b", witness="w1")
    net.add_witness("w2")
    run_checking(net, 2.0)
    (holder,) = net.holders()
    other = "b" if holder == "a" else "a"
    # the other appliance is reconfigured (w1 -> w2) and restarted while cut off
    net.partition("a", "b")
    net.kill(other)
    net.add_node(other, [holder], ["w2"], confirmed=net.nodes[holder].members.digest)
    assert run_checking(net, 6.0) == {holder}
    assert net.nodes[other].status(net.now)["membership"]["blocked"] == "unconfirmed"
    # healed, it sees the holder's other membership: still no lease for it
    net.heal()
    run_checking(net, 8.0)
    assert net.nodes[other].status(net.now)["membership"]["blocked"] == "mismatch"
    # the holder is reconfigured the same way: both confirm, one holds
    net.kill(holder)
    net.add_node(holder, [other], ["w2"])
    assert len(run_checking(net, 12.0)) >= 1 and len(net.holders()) == 1
    assert all(n.status(net.now)["membership"]["confirmed"] for n in net.nodes.values())


def test_a_new_rack_confirms_its_membership_and_remembers_it():
    net = Net()
    net.rack("a", "b")
    run_checking(net, 2.0)
    assert len(net.holders()) == 1
    assert net.confirmed == {"a": net.nodes["a"].members.digest, "b": net.nodes["a"].members.digest}
    # restarted alone (the other appliance is down), a confirmed membership needs nobody
    net.kill("a")
    net.kill("b")
    net.add_node("a", ["b"], ["w"])
    assert run_checking(net, 6.0) == {"a"}


def test_answers_from_nodes_that_are_not_our_acceptors_do_not_count():
    net = Net()
    net.rack("a", "b")
    node = net.nodes["a"]
    node.handle_timer(net.now)
    req = node.proposer.round.req
    from appliance.ha.messages import Promise

    for stranger in ("x", "y"):  # cluster members, but not in this rack's configuration
        node.receive(stranger, stranger, Promise(
            "rack1", req, 1, True, "", "", 0, 0.0, 0, False, 1, "a", node.members.digest
        ), net.now)  # fmt: skip
    assert node.proposer.round.phase == 1 and node.proposer.strangers == 2


def test_two_racks_keeping_the_default_name_do_not_share_the_witness():
    net = Net()
    net.add_witness("w")
    for name, other in (("a1", "b1"), ("b1", "a1"), ("a2", "b2"), ("b2", "a2")):
        net.add_node(name, [other], ["w"])
    run_checking_two = []
    for _ in range(400):
        net.run_until(net.now + 0.01)
        run_checking_two.append(sorted(net.holders()))
    holders = net.holders()
    assert len(holders) == 2 and {h[1] for h in holders} == {"1", "2"}
    assert set(net.witnesses["w"].status(net.now)) == {"rack1", "rack1#2"}
