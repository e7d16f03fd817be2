"""The HA service of a node (trio shell): the election drives the node's role.

``node.ha`` is one :class:`HaService`. Without peers or witnesses in
``[ha]`` it elects nothing (``elects`` is false) and the node stays active
by itself, as a standalone node always has. Otherwise it runs the embedded
election (:class:`~appliance.ha.runner.ElectionRunner` over signed UDP) or
the etcd backend, and on its events:

* lease acquired: fence granted until the lease's end, role ``active``
  (plugins start dynamic answers), the virtual IP added and announced;
* renewed: the fence moves forward;
* lost or released: fence revoked at once, role ``standby`` (the lost
  event comes ``step_down_lead`` before validity ends), the VIP removed.

Operators: ``rackboot ha status|promote|demote|handover|maintenance on|off`` (the
``ha.*`` control commands), SIGUSR1 (promote) and SIGUSR2 (demote). When the
service stops it releases the lease so the standby takes over at once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from appliance.api import Role
from appliance.cluster.files import write_atomically
from appliance.control import ControlRequestError
from appliance.errors import RackbootError
from appliance.ha.election import Election
from appliance.ha.metrics import HaCollector
from appliance.ha.proposer import Acquired, Event, Lost, Renewed
from appliance.ha.runner import ElectionRunner, TrioClock
from appliance.ha.schema import SPLIT_BRAIN_OPT_IN, parse_member, timing_from
from appliance.ha.udp import UdpTransport
from appliance.ha.vip import Vip, VipKeeper
from appliance.logs import get_logger

log = get_logger("ha")

STATE_FILE = "state.json"


@dataclass
class Durable:
    """What the election keeps on disk (``<data_dir>/ha/state.json``), written atomically
    and fsynced before anything that relies on it is sent:

    * ``epoch``: the highest epoch this node's acceptor accepted;
    * ``longest_lease``: the longest lease it may have granted in any life, so the restart
      wait after lowering ``[ha] lease`` still covers grants made with the old one;
    * ``boots``: how many times the election started: the high half of request ids, which
      must rise across restarts so acceptors can tell a replay from a new request;
    * ``members``: the membership digest every other appliance was last seen to share
      (a changed configuration takes the lease only once they share it again);
    * ``ineligible``: the appliances the last proposal this acceptor accepted declared
      ineligible to take over (it refuses them until a later proposal clears them).
    """

    epoch: int = 0
    longest_lease: float = 0.0
    boots: int = 0
    members: str = ""
    ineligible: list[str] = dataclasses.field(default_factory=list)


def read_durable(directory: Path) -> Durable:
    path = directory / STATE_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return Durable(epoch=_read_legacy_epoch(directory / "epoch"))
    except OSError as exc:
        raise RackbootError(
            f"cannot read the election's state from {path}: {exc.strerror}"
        ) from None
    except ValueError:
        raise RackbootError(f"{path} is not the election's state (not JSON)") from None
    fields = {"epoch": int, "longest_lease": (int, float), "boots": int}
    if not isinstance(raw, dict) or any(
        not isinstance(raw.get(k), t) or isinstance(raw.get(k), bool) or raw[k] < 0
        for k, t in fields.items()
    ):
        raise RackbootError(
            f"{path} holds {str(raw)[:80]!r}: expected epoch, longest_lease and boots >= 0"
        )
    members = raw.get("members", "")
    if not isinstance(members, str) or len(members) > 64:
        raise RackbootError(f"{path}: 'members' is not a membership digest")
    ineligible = raw.get("ineligible", [])
    if not isinstance(ineligible, list) or not all(
        isinstance(n, str) and len(n) <= 64 for n in ineligible
    ):
        raise RackbootError(f"{path}: 'ineligible' is not a list of node ids")
    return Durable(int(raw["epoch"]), float(raw["longest_lease"]), int(raw["boots"]), members,
                   ineligible)  # fmt: skip


def _read_legacy_epoch(path: Path) -> int:
    """Before ``state.json`` only the epoch was kept, as text in ``ha/epoch``."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise RackbootError(
            f"cannot read the election's epoch from {path}: {exc.strerror}"
        ) from None
    if not text.isdigit():
        raise RackbootError(f"{path} holds {text[:40]!r}, not an epoch (a whole number)")
    return int(text)


def write_durable(directory: Path, state: Durable) -> None:
    """Atomically and durably: an acceptor answers only once this returned."""
    data = json.dumps(dataclasses.asdict(state), sort_keys=True).encode() + b"\n"
    write_atomically(directory / STATE_FILE, data, 0o600)


class HaService:
    def __init__(self, node: Any, settings: Any, source: str) -> None:
        self.node = node
        self.settings = settings
        self.timing = timing_from(settings, source)
        self.source = source
        self.backend = settings.backend
        self.elects = self.backend == "etcd" or bool(settings.peers or settings.witnesses)
        self.election: Election | None = None
        self.runner: ElectionRunner | None = None
        self.transport: UdpTransport | None = None
        self.etcd: Any = None
        self.state_dir = Path(node.data_dir) / "ha"
        self.durable = Durable()
        self._writing = trio.Lock()  # one writer of state.json at a time
        self.vip: VipKeeper | None = None
        if settings.vip:
            node.fence.vip = settings.vip.split("/")[0]
            self.vip = VipKeeper(
                Vip(settings.vip, settings.vip_interface), node.fence,
                count=settings.garp_count, interval=settings.garp_interval,
                lead=self.timing.step_down_lead,
            )  # fmt: skip
        self.transitions = {"acquired": 0, "lost": 0}
        # Renewals while holding, and the least validity left when one landed since the last
        # acquisition: a holder renewing on schedule keeps about lease - margin - renew.
        self.renewals = 0
        self.lowest_left: float | None = None
        if self.elects:
            node.metrics.register(HaCollector(self.status))
        self.last_change = ""
        self.changed_at: dict[str, float] = {}  # "acquired"/"lost" -> wall time, for operators

    # -- the service ---------------------------------------------------------------

    async def run(self, node: Any, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if not self.elects:
            log.info("standalone: no [ha] peers or witnesses, this node is always active")
            task_status.started()
            return
        if self.backend == "embedded" and getattr(self.node.cluster, "identity", None) is None:
            raise RackbootError(
                "[ha] names peers or witnesses but this node has no cluster identity: "
                "the election is signed with it (run `rackboot cluster init` or `join` first)"
            )
        async with trio.open_nursery() as nursery:
            if self.vip is not None:
                await nursery.start(self.vip.run)
            if self.backend == "etcd":
                from appliance.ha.etcd import EtcdElection

                self.etcd = EtcdElection(self, self.settings)
                await nursery.start(self.etcd.run)
            else:
                await self._start_embedded(nursery)
            if node.handle_signals:
                await nursery.start(self._signals)
            task_status.started()

    async def _start_embedded(self, nursery: trio.Nursery) -> None:
        identity = self.node.cluster.identity
        settings = self.settings
        durable = await trio.to_thread.run_sync(read_durable, self.state_dir)
        # Before voting: the restart wait covers the longest lease of any earlier life, and
        # this life's request ids start above every earlier one.
        restart_wait = durable.longest_lease
        durable.longest_lease = max(durable.longest_lease, self.timing.lease)
        durable.boots += 1
        await self._write(durable)
        now = trio.current_time()
        peers, witnesses = (
            dict(map(parse_member, listed)) for listed in (settings.peers, settings.witnesses)
        )
        if identity.node_id in peers or identity.node_id in witnesses:
            raise RackbootError(
                f"{self.source}: [ha] lists this node ({identity.node_id}) among its own peers "
                "or witnesses: list the other members only"
            )
        self.election = Election(
            identity.node_id, self.node.config.node.rack, self.timing,
            peers=peers, witnesses=witnesses, now=now,
            known_epoch=durable.epoch, incarnation=durable.boots, rng=random.Random(),
            split_brain_opt_in=settings[SPLIT_BRAIN_OPT_IN], maintenance=settings.maintenance,
            restart_wait=restart_wait, confirmed=durable.members,
            ineligible=frozenset(durable.ineligible),
        )  # fmt: skip
        replication = getattr(self.node, "replication", None)
        self.transport = UdpTransport(
            identity, str(settings.listen), settings.port,
            revocations=lambda: self.node.cluster.identity.revocations,
            adopt=lambda crl: self.node.cluster.accept_crl(crl.der), speaks=self.node.speaks,
        )  # fmt: skip
        await self.transport.bind([*peers.values(), *witnesses.values()])
        self.runner = ElectionRunner(
            self.election, self.transport.send, clock=TrioClock(),
            on_event=self.on_event, persist=self._persist, confirm=self._confirm,
            persist_ineligible=self._persist_ineligible,
            notice=lambda text: log.warning("membership mismatch", detail=text),
        )  # fmt: skip
        if replication is not None:  # it declares the standbys that lag ineligible
            replication.election, replication.poke_election = self.election, self.runner.poke
        log.info(
            "election", node_id=identity.node_id, rack=self.node.config.node.rack,
            port=self.transport.port, acceptors=self.election.proposer.acceptors,
            quorum=self.election.proposer.quorum, lease=self.timing.lease,
            renew=self.timing.renew, margin=self.timing.margin,
            restart_wait=round(self.election.acceptor.ready_at - now, 3),
        )  # fmt: skip
        nursery.start_soon(self._serve_embedded)
        if durable.longest_lease > self.timing.lease:
            nursery.start_soon(self._forget_longer_lease, self.election.acceptor.ready_at)

    async def _forget_longer_lease(self, ready_at: float) -> None:
        """Once the restart wait is over, every grant of an earlier, longer lease has run
        out: from then on only this life's lease needs covering."""
        await trio.sleep_until(ready_at)
        self.durable.longest_lease = self.timing.lease
        await self._write(self.durable)

    async def _write(self, state: Durable) -> None:
        async with self._writing:
            self.durable = state
            await trio.to_thread.run_sync(write_durable, self.state_dir, state)

    async def _serve_embedded(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.transport.serve, self.runner.deliver)
                nursery.start_soon(self.runner.run)
        finally:
            # Going away: stop acting, then tell the acceptors so the standby takes over now.
            self.election.shutdown(trio.current_time())
            while (event := self.election.next_event()) is not None:
                self.on_event(event)  # the fence revoked before the release leaves
            for address, message in self.election.datagrams_to_send():
                self.transport.send(address, message)
            self.transport.close()

    async def _persist(self, epoch: int) -> None:
        await self._write(dataclasses.replace(self.durable, epoch=epoch))

    async def _persist_ineligible(self, ineligible: frozenset[str]) -> None:
        await self._write(dataclasses.replace(self.durable, ineligible=sorted(ineligible)))

    async def _confirm(self, digest: str) -> None:
        log.info("membership confirmed by every appliance of the rack", digest=digest)
        await self._write(dataclasses.replace(self.durable, members=digest))

    async def _signals(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGUSR1:
                    log.info("SIGUSR1: becoming active if allowed")
                    self.promote({})
                else:
                    log.info("SIGUSR2: stepping down")
                    self.demote({})

    # -- events -> role, fence, VIP ------------------------------------------------

    def on_event(self, event: Event) -> None:
        node = self.node
        if isinstance(event, Acquired):
            self.transitions["acquired"] += 1
            self.changed_at["acquired"] = time.time()
            self.last_change = f"acquired epoch {event.epoch}"
            log.info("lease acquired", epoch=event.epoch)
            self.lowest_left = None
            node.set_role(Role.ACTIVE, valid_until=event.valid_until, epoch=event.epoch)
            if self.vip is not None:
                self.vip.want(True)
        elif isinstance(event, Renewed):
            left = node.fence.valid_until - trio.current_time()
            self.renewals += 1
            self.lowest_left = left if self.lowest_left is None else min(self.lowest_left, left)
            node.fence.grant(event.valid_until, event.epoch)
            if self.vip is not None:
                self.vip.renewed()
        elif isinstance(event, Lost):
            self.transitions["lost"] += 1
            self.changed_at["lost"] = time.time()
            self.last_change = f"lost epoch {event.epoch}: {event.reason}"
            node.fence.revoke()
            (log.warning if event.reason in ("expired", "key-lost") else log.info)(
                "lease lost", epoch=event.epoch, reason=event.reason
            )
            node.set_role(Role.STANDBY)
            if self.vip is not None:
                self.vip.want(False)

    # -- operator ------------------------------------------------------------------

    def _machine(self):
        if not self.elects:
            raise ControlRequestError("this node is standalone ([ha] has no peers or witnesses)")
        machine = self.etcd if self.backend == "etcd" else self.election
        if machine is None:
            raise ControlRequestError("the election has not started yet")
        return machine

    def _after(self) -> dict[str, Any]:
        if self.runner is not None:
            self.runner.poke()
        if self.etcd is not None:
            self.etcd.poke()
        return self.status()

    def promote(self, args: dict[str, Any]) -> dict[str, Any]:
        force = args.get("force") is True
        machine = self._machine()
        if machine.maintenance:
            raise ControlRequestError(
                "this node is in maintenance: `rackboot ha maintenance off` first"
            )
        if force:
            log.warning(
                "promote forced: epochs vouched for by restarted witnesses are trusted, and "
                "this node may be elected although the holder declared it ineligible: records "
                "the holder committed without it may be lost"
            )
        machine.promote(trio.current_time(), force=force)
        return self._after()

    def demote(self, args: dict[str, Any]) -> dict[str, Any]:
        self._machine().demote(trio.current_time())
        return self._after()

    def handover(self, args: dict[str, Any]) -> dict[str, Any]:
        """On the active: hand the lease to a standby once it has caught up (``to``: which
        one); on a standby: ask the active to hand over to this node."""
        to = args.get("to") or None
        if to is not None and not isinstance(to, str):
            raise ControlRequestError("ha.handover: 'to' must be a node id")
        machine = self._machine()
        if self.backend == "etcd":
            raise ControlRequestError(
                "the etcd backend has no channel between the appliances: run `rackboot ha "
                "demote` on the active instead"
            )
        if machine.maintenance:
            raise ControlRequestError(
                "this node is in maintenance: `rackboot ha maintenance off` first"
            )
        try:
            machine.hand_over(trio.current_time(), to)
        except ValueError as exc:
            raise ControlRequestError(str(exc)) from None
        log.info("hand-over asked", to=to or "")
        return self._after()

    def maintenance(self, args: dict[str, Any]) -> dict[str, Any]:
        on = args.get("on")
        if not isinstance(on, bool):
            raise ControlRequestError("ha.maintenance needs 'on': true or false")
        self._machine().set_maintenance(on, trio.current_time())
        log.info("maintenance " + ("on: never taking the lease" if on else "off"))
        return self._after()

    def control_commands(self) -> dict[str, Any]:
        return {
            "ha.status": lambda args: self.status(),
            "ha.promote": self.promote,
            "ha.demote": self.demote,
            "ha.handover": self.handover,
            "ha.maintenance": self.maintenance,
        }

    def status(self) -> dict[str, Any]:
        now = trio.current_time()
        fence = self.node.fence
        out: dict[str, Any] = {
            "mode": "standalone" if not self.elects else self.backend,
            "role": str(self.node.role),
            "valid_for": _seconds_left(fence.valid_until, now),
            "epoch": fence.epoch if fence.valid_until > now else None,
            "fence_refusals": fence.refused,
            "transitions": dict(self.transitions),
            "renewals": self.renewals,
            "lowest_left": None if self.lowest_left is None else round(self.lowest_left, 3),
            "last_change": self.last_change,
            "changed_at": dict(self.changed_at),
            "timing": {"lease": self.timing.lease, "renew": self.timing.renew,
                       "margin": self.timing.margin},
        }  # fmt: skip
        machine = self.etcd if self.backend == "etcd" else self.election
        if machine is not None:
            out["election"] = machine.status(now)
        if self.transport is not None:
            out["transport"] = {
                "port": self.transport.port, **self.transport.counters,
                "dropped": dict(self.transport.dropped),
                "heard": self.transport.heard(now),  # seconds ago, by node id: who answers
                "versions": {n: p.status() for n, p in self.transport.versions.items()},
            }  # fmt: skip
        if self.vip is not None:
            out["vip"] = {
                "address": self.settings.vip, "interface": self.settings.vip_interface,
                "held": self.vip.held, "announced": self.vip.announced, "errors": self.vip.errors,
                "guard_restarts": self.vip.guard_restarts,
            }  # fmt: skip
        return out


def _seconds_left(until: float, now: float) -> float | None:
    """Seconds of validity left; None for an endless lease (a standalone node), which JSON
    cannot carry as a number."""
    if until == math.inf:
        return None
    return round(until - now, 3) if until > now else 0.0
