"""The rolling update's shell on each appliance (trio): start, drive, apply, report.

* ``rackboot firmware roll BUNDLE`` (control ``roll.start``) on either appliance:
  the bundle is copied in (``<data_dir>/rolling/bundles``, by SHA-256) and checked
  by this appliance's updater; the holder of the lease starts the roll, a standby
  asks the holder to (``roll.start`` over the peer link) and serves it the bundle.
* The holder drives a running roll (:mod:`appliance.rolling.plan`) about once a
  second: it asks every other appliance how it is (``roll.state``), reads its
  replication's view of who has caught up, and carries out what the planner says:
  write the record to the state log, ask an appliance to install (``roll.apply``),
  hand the lease over (docs/ha.md). The record being in the replicated log, the
  next holder carries on where this one stopped.
* Any appliance, asked to install, fetches the bundle from the roll's sources
  (``roll.chunk``, chunks over the peer link), has its updater install it, and
  restarts into it (appliance/rolling/updater.py).

Requests are taken from the rack's appliances only (``[ha] peers``).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import trio

from appliance.control import ControlRequestError
from appliance.errors import RackbootError
from appliance.ha.schema import parse_member
from appliance.logs import get_logger
from appliance.rolling import plan
from appliance.rolling.bundles import Bundles
from appliance.rolling.updater import Updater

log = get_logger("rolling")

NS, KEY = "rolling", "roll"  # the state log record of the rack's roll
TICK = 1.0  # s between looks while a roll runs
ASK_TIMEOUT = 3.0  # s an appliance has to say how it is
DEFAULT_TIMEOUT = 900.0  # s an appliance has to come back updated (a reboot, a health check)


class Rolling:
    def __init__(self, node: Any, updater: Updater) -> None:
        self.node = node
        self.updater = updater
        self.bundles = Bundles(Path(node.data_dir) / "rolling" / "bundles")
        self.peers = [parse_member(m)[0] for m in node.config["ha"].peers]
        self.busy = ""  # what this appliance does for a roll now
        self.error: tuple[str, str] = ("", "")  # (roll id, why its apply failed here)
        self.seen: dict[str, dict[str, Any]] = {}  # the holder's last look, for status
        self._wake = trio.Event()

    @property
    def me(self) -> str:
        return self.node.cluster.identity.node_id

    # -- the service ------------------------------------------------------------------

    async def run(self, node: Any, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        handlers = {"roll.state": self._state, "roll.apply": self._apply_asked,
                    "roll.chunk": self._chunk, "roll.start": self._start_asked}  # fmt: skip
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.node.cluster.handlers.update(handlers)
            nursery.start_soon(self._drive)
            task_status.started()

    def record(self) -> plan.Roll | None:
        value = self.node.state.get(NS, KEY) if self.node.state is not None else None
        try:
            return None if value is None else plan.from_record(value)
        except plan.RollError as exc:
            log.error("the roll record is unreadable", error=str(exc))
            return None

    async def _drive(self) -> None:
        while True:
            with trio.move_on_after(TICK):
                await self._wake.wait()
            self._wake = trio.Event()
            roll = self.record()
            if roll is None or roll.state != plan.RUNNING or not self.node.fence.ok():
                continue
            try:
                seen = await self._look(roll)
                new, actions = plan.step(roll, self.me, seen, time.time())
                await self._carry_out(new, actions)
            except Exception as exc:  # a bug here must not stop the node: logged, next tick
                log.error("roll: a look failed", roll=roll.id,
                          error=f"{type(exc).__name__}: {exc}")  # fmt: skip

    async def _look(self, roll: plan.Roll) -> dict[str, plan.Seen]:
        caught_up = self.node.replication.caught_up()
        seen: dict[str, plan.Seen] = {}

        async def ask(peer: str) -> None:
            try:
                with trio.fail_after(ASK_TIMEOUT):
                    got = await self.node.cluster.call(peer, "roll.state", {"roll": roll.id},
                                                       timeout=ASK_TIMEOUT)  # fmt: skip
            except (RackbootError, trio.TooSlowError) as exc:
                self.seen[peer] = {"reachable": False, "why": str(exc)[:200]}
                seen[peer] = plan.Seen(False)
                return
            self.seen[peer] = got
            seen[peer] = _seen(got, roll.id, peer in caught_up)

        async with trio.open_nursery() as nursery:
            for peer in roll.order:
                if peer != self.me:
                    nursery.start_soon(ask, peer)
        seen[self.me] = _seen(self._state_now(roll.id), roll.id, True)
        return seen

    async def _carry_out(self, roll: plan.Roll, actions: list[plan.Action]) -> None:
        for action in actions:
            if isinstance(action, plan.Saved):
                if not await self._save(roll):
                    return  # the lease went meanwhile: the next holder looks again
            elif isinstance(action, plan.Apply):
                self._nursery.start_soon(self._ask_to_apply, roll, action.node)
            elif isinstance(action, plan.HandOver):
                log.info("roll: handing the lease over", roll=roll.id, to=action.to)
                try:
                    self.node.ha.handover({"to": action.to})
                except ControlRequestError as exc:
                    log.warning("roll: the hand-over was refused", error=str(exc))
        if roll.state != plan.RUNNING:
            (log.info if roll.state == plan.DONE else log.error)(
                f"roll {roll.state}", roll=roll.id, version=roll.version, reason=roll.reason
            )

    async def _save(self, roll: plan.Roll) -> bool:
        try:
            await self.node.state.put(NS, KEY, roll.record())
        except RackbootError as exc:  # NotWriter: no longer the holder
            log.info("roll record not written", error=str(exc))
            return False
        return True

    async def _ask_to_apply(self, roll: plan.Roll, node: str) -> None:
        args = {"roll": roll.id, "bundle": roll.bundle, "size": roll.size,
                "version": roll.version, "sources": roll.sources}  # fmt: skip
        log.info("roll: asking to install", roll=roll.id, node_id=node, version=roll.version)
        try:
            await self.node.cluster.call(node, "roll.apply", args, timeout=10.0)
        except RackbootError as exc:
            current = self.record()
            if current is not None and current.id == roll.id and current.state == plan.RUNNING:
                plan.fail(current, node, f"it was not asked to install: {exc}", time.time())
                await self._save(current)

    # -- starting -----------------------------------------------------------------------

    async def start(self, args: dict[str, Any]) -> dict[str, Any]:
        """Control ``roll.start``: ``bundle`` (a path here), ``timeout`` (s per appliance)."""
        path, timeout = args.get("bundle"), args.get("timeout") or DEFAULT_TIMEOUT
        if not isinstance(path, str) or not path.startswith("/"):
            raise ControlRequestError("roll.start needs 'bundle': an absolute path")
        if not isinstance(timeout, int | float) or not 10 <= timeout <= 86400:
            raise ControlRequestError("roll.start: 'timeout' must be 10 to 86400 seconds")
        digest, size = await trio.to_thread.run_sync(self.bundles.stage, Path(path))
        version = await trio.to_thread.run_sync(self.updater.check, self.bundles.path(digest))
        ask = {"bundle": digest, "size": size, "version": version, "timeout": float(timeout)}
        if self.node.fence.ok():
            await self._begin(ask, source=self.me)
        else:
            holder = self._holder()
            await self.node.cluster.call(holder, "roll.start", ask, timeout=30.0)
        return self.status()

    async def _start_asked(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        self._from_the_rack(caller)
        if not self.node.fence.ok():
            raise RackbootError("this appliance does not hold the lease: ask the one that does")
        await self._begin(args, source=caller)
        return {"roll": self.record().record()}  # type: ignore[union-attr]

    async def _begin(self, ask: dict[str, Any], source: str) -> None:
        current = self.record()
        if current is not None and current.state == plan.RUNNING:
            raise RackbootError(f"roll {current.id} to {current.version} is running: it ends "
                                "first (done or failed)")  # fmt: skip
        versions = {self.me: self.updater.firmware().version}
        for peer in self.peers:
            try:
                got = await self.node.cluster.call(peer, "roll.state", {}, timeout=ASK_TIMEOUT)
            except RackbootError as exc:
                raise RackbootError(f"appliance {peer} cannot take part in a roll: {exc}") from None
            versions[peer] = str(got.get("firmware", {}).get("version", ""))
        try:
            roll = plan.start(
                secrets.token_hex(4), str(ask["bundle"]), int(ask["size"]), str(ask["version"]),
                me=self.me, appliances=[self.me, *self.peers], versions=versions,
                now=time.time(), timeout=float(ask["timeout"]),
            )  # fmt: skip
        except (plan.RollError, KeyError, ValueError) as exc:
            raise RackbootError(f"cannot start the roll: {exc}") from None
        roll.sources = sorted({source, self.me})
        await self.node.state.put(NS, KEY, roll.record())
        log.info("roll started", roll=roll.id, version=roll.version, order=",".join(roll.order))
        self._wake.set()

    def _holder(self) -> str:
        following = getattr(self.node.replication, "following", {}) or {}
        holder = following.get("leader") or self.node.ha.status().get("election", {}).get(
            "holder_seen", "")  # fmt: skip
        if not holder:
            raise RackbootError("no appliance holds the lease now: start the roll on the active")
        return holder

    # -- what the other appliances ask --------------------------------------------------

    def _from_the_rack(self, caller: str) -> None:
        if caller not in self.peers:
            raise RackbootError(f"{caller} is not an appliance of this rack")

    async def _state(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        self._from_the_rack(caller)
        return self._state_now(str(args.get("roll", "")))

    def _state_now(self, roll_id: str) -> dict[str, Any]:
        failed_roll, why = self.error
        return {
            "firmware": self.updater.firmware().status(),
            "busy": self.busy,
            "error": why if failed_roll == roll_id and roll_id else "",
        }

    async def _apply_asked(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        self._from_the_rack(caller)
        if self.busy:
            raise RackbootError(f"busy: {self.busy}")
        sources = args.get("sources")
        if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
            raise RackbootError("roll.apply needs 'sources'")
        self.bundles.path(args.get("bundle"))  # refuses what is not a digest
        self.busy = "fetching the bundle"
        self._nursery.start_soon(self._apply, dict(args))
        return {"accepted": True}

    async def _apply(self, args: dict[str, Any]) -> None:
        roll_id = str(args.get("roll"))
        try:
            path = await self.bundles.fetch(args["bundle"], int(args["size"]), args["sources"],
                                            self.node.cluster.call)  # fmt: skip
            self.busy = "checking the bundle"
            version = await trio.to_thread.run_sync(self.updater.check, path)
            if version != args.get("version"):
                raise RackbootError(f"the bundle installs {version}, the roll says "
                                    f"{args.get('version')}")  # fmt: skip
            self.busy = "installing"
            await trio.to_thread.run_sync(self.updater.install, path)
            self.busy = "restarting into the new version"
            log.warning("roll: restarting into the new version", roll=roll_id, version=version)
            self.updater.restart()
        except (RackbootError, KeyError, ValueError, TypeError) as exc:
            self.busy, self.error = "", (roll_id, str(exc)[:300])
            log.error("roll: could not install", roll=roll_id, error=str(exc))

    async def _chunk(self, caller: str, args: dict[str, Any]) -> bytes:
        self._from_the_rack(caller)
        return await trio.to_thread.run_sync(
            self.bundles.read, args.get("bundle"), args.get("offset"), args.get("length")
        )

    # -- status -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        roll = self.record()
        return {
            **self._state_now(roll.id if roll else ""),
            "roll": roll.record() if roll else None,
            "seen": dict(self.seen) if roll and roll.state == plan.RUNNING else {},
        }


def _seen(got: Any, roll_id: str, caught_up: bool) -> plan.Seen:
    """What an appliance said of itself (from the peer link: checked, not trusted)."""
    firmware = got.get("firmware") if isinstance(got, dict) else None
    if not isinstance(firmware, dict):
        return plan.Seen(False)

    def text(value: Any) -> str:
        return value[:300] if isinstance(value, str) else ""

    return plan.Seen(
        True, version=text(firmware.get("version")), trial=firmware.get("trial") is True,
        failed=text(firmware.get("failed")), why=text(firmware.get("why")),
        busy=text(got.get("busy")), error=text(got.get("error")), caught_up=caught_up,
    )  # fmt: skip
