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

Operators: ``rackboot ha status|promote|demote|maintenance on|off`` (the
``ha.*`` control commands), SIGUSR1 (promote) and SIGUSR2 (demote). When the
service stops it releases the lease so the standby takes over at once.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import trio

from appliance.api import Role
from appliance.cluster.files import write_atomically
from appliance.control import ControlRequestError
from appliance.errors import RackbootError
from appliance.ha.election import Election
from appliance.ha.proposer import Acquired, Event, Lost, Renewed
from appliance.ha.runner import ElectionRunner, TrioClock
from appliance.ha.schema import SPLIT_BRAIN_OPT_IN, timing_from
from appliance.ha.udp import UdpTransport
from appliance.ha.vip import Vip, VipKeeper
from appliance.logs import get_logger

log = get_logger("ha")


def read_epoch(path: Path) -> int:
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


def write_epoch(path: Path, epoch: int) -> None:
    """Atomically and durably: an acceptor answers only once this returned."""
    write_atomically(path, f"{epoch}\n".encode(), 0o600)


class HaService:
    def __init__(self, node: Any, settings: Any, source: str) -> None:
        self.node = node
        self.settings = settings
        self.timing = timing_from(settings, source)
        self.backend = settings.backend
        self.elects = self.backend == "etcd" or bool(settings.peers or settings.witnesses)
        self.election: Election | None = None
        self.runner: ElectionRunner | None = None
        self.transport: UdpTransport | None = None
        self.etcd: Any = None
        self.epoch_path = Path(node.data_dir) / "ha" / "epoch"
        self.vip: VipKeeper | None = None
        if settings.vip:
            node.fence.vip = settings.vip.split("/")[0]
            self.vip = VipKeeper(
                Vip(settings.vip, settings.vip_interface), node.fence,
                count=settings.garp_count, interval=settings.garp_interval,
            )  # fmt: skip
        self.transitions = {"acquired": 0, "lost": 0}
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
        now = trio.current_time()
        self.election = Election(
            identity.node_id, self.node.config.node.rack, self.timing,
            peers=list(settings.peers), witnesses=list(settings.witnesses), now=now,
            known_epoch=await trio.to_thread.run_sync(read_epoch, self.epoch_path),
            incarnation=random.getrandbits(31), rng=random.Random(),
            split_brain_opt_in=settings[SPLIT_BRAIN_OPT_IN], maintenance=settings.maintenance,
        )  # fmt: skip
        self.transport = UdpTransport(identity, str(settings.listen), settings.port)
        await self.transport.bind([*settings.peers, *settings.witnesses])
        self.runner = ElectionRunner(
            self.election, self.transport.send, clock=TrioClock(),
            on_event=self.on_event, persist=self._persist,
        )  # fmt: skip
        log.info(
            "election", node_id=identity.node_id, rack=self.node.config.node.rack,
            port=self.transport.port, acceptors=self.election.proposer.acceptors,
            quorum=self.election.proposer.quorum, lease=self.timing.lease,
            renew=self.timing.renew, margin=self.timing.margin,
        )  # fmt: skip
        nursery.start_soon(self._serve_embedded)

    async def _serve_embedded(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.transport.serve, self.runner.deliver)
                nursery.start_soon(self.runner.run)
        finally:
            # Going away: stop acting, then tell the acceptors so the standby takes over now.
            self.election.shutdown(trio.current_time())
            for address, message in self.election.datagrams_to_send():
                self.transport.send(address, message)
            while (event := self.election.next_event()) is not None:
                self.on_event(event)
            self.transport.close()

    async def _persist(self, epoch: int) -> None:
        await trio.to_thread.run_sync(write_epoch, self.epoch_path, epoch)

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
            node.set_role(Role.ACTIVE, valid_until=event.valid_until, epoch=event.epoch)
            if self.vip is not None:
                self.vip.want(True)
        elif isinstance(event, Renewed):
            node.fence.grant(event.valid_until, event.epoch)
        elif isinstance(event, Lost):
            self.transitions["lost"] += 1
            self.changed_at["lost"] = time.time()
            self.last_change = f"lost epoch {event.epoch}: {event.reason}"
            node.fence.revoke()
            (log.info if event.reason != "expired" else log.warning)(
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
            log.warning("promote forced: epochs vouched for by restarted witnesses are trusted")
        machine.promote(trio.current_time(), force=force)
        return self._after()

    def demote(self, args: dict[str, Any]) -> dict[str, Any]:
        self._machine().demote(trio.current_time())
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
            "ha.maintenance": self.maintenance,
        }

    def status(self) -> dict[str, Any]:
        now = trio.current_time()
        fence = self.node.fence
        out: dict[str, Any] = {
            "mode": "standalone" if not self.elects else self.backend,
            "role": str(self.node.role),
            "valid_for": round(fence.valid_until - now, 3) if fence.valid_until > now else 0.0,
            "epoch": fence.epoch if fence.valid_until > now else None,
            "fence_refusals": fence.refused,
            "transitions": dict(self.transitions),
            "last_change": self.last_change,
            "changed_at": dict(self.changed_at),
            "timing": {"lease": self.timing.lease, "renew": self.timing.renew,
                       "margin": self.timing.margin},
        }  # fmt: skip
        machine = self.etcd if self.backend == "etcd" else self.election
        if machine is not None:
            out["election"] = machine.status(now)
        if self.transport is not None:
            out["transport"] = {"port": self.transport.port, **self.transport.counters}
        if self.vip is not None:
            out["vip"] = {
                "address": self.settings.vip, "interface": self.settings.vip_interface,
                "held": self.vip.held, "announced": self.vip.announced, "errors": self.vip.errors,
            }  # fmt: skip
        return out
