"""A machine's provisioning workflow, sans-IO: stages, deadlines, retries, spares.

:class:`Workflow` holds every machine's :class:`Record` (the state the rack
replicates) and turns what happened into what to do. Its inputs are
observations with an explicit ``now`` (:meth:`Workflow.request`,
:meth:`~Workflow.dhcp`, :meth:`~Workflow.fetched`, :meth:`~Workflow.installer`)
and the passing of time (:meth:`~Workflow.tick`); its outputs are
:class:`Actions`: records to save (the shell commits them to the state log),
power actions, and what the metrics count. It imports no trio, socket or clock.

Stages, in order (``STAGES``): ``requested`` (powered on, waiting for DHCP) →
``discovered`` (a lease) → ``loader`` (the boot script or loader fetched) →
``kernel`` (kernel and every initrd fetched) → ``installing`` (the installer's
first event) → ``provisioned`` (its ``ok``). Each stage but the last has a
deadline (its timeout from entering it; an installer's ``progress`` restarts
``installing``'s). A deadline passed or a ``failed`` event is a failed attempt:
the machine is power-cycled and starts again at ``requested``, up to
``retries`` times; then it is ``failed`` and marked for deprovisioning, and when
its profile allows, a ``spare`` of its pool takes its profile and is powered on.
With ``race``, a spare is provisioned beside the machine from the start and the
slower of the two is released back to the pool when the other is provisioned.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

STAGES = ("requested", "discovered", "loader", "kernel", "installing", "provisioned")
IDLE = ("idle", "spare", "failed")  # states without a deadline (and provisioned)
STATES = (*STAGES, *IDLE)
MAX_HISTORY = 64  # entries a record keeps (newest)
MAX_RECORD = 16 * 1024  # bytes of an encoded record the shell accepts from the state


@dataclass(frozen=True)
class Timeouts:
    requested: float = 300.0  # power-on to DHCP (firmware, POST: minutes on servers)
    discovered: float = 120.0  # DHCP to the loader or boot script
    loader: float = 300.0  # loader to kernel and initrds
    kernel: float = 600.0  # kernel to the installer's first event
    installing: float = 1800.0  # between installer events

    def of(self, state: str) -> float | None:
        return getattr(self, state, None)


@dataclass(frozen=True)
class Record:
    """One machine, as the rack's state holds it."""

    name: str
    macs: tuple[str, ...]
    profile: str
    pool: str = ""
    power: str = (
        ""  # how a power plugin reaches it: "redfish://bmc/redfish/v1/Systems/1", "qemu:..."
    )
    spare_ok: bool = True  # may a spare of the pool replace it after its retries?
    state: str = "idle"  # "spare": idle in its pool, free to take a failed one's place
    since: float = 0.0  # when it entered ``state``
    deadline: float | None = None
    attempt: int = 0  # failed attempts of this provisioning
    fetched: tuple[str, ...] = ()  # of the current attempt: "kernel", "initrd:N"
    initrds: int = 0  # how many initrds the profile loads
    started: float | None = None  # when this provisioning was requested
    deprovision: bool = False  # failed hardware: to be taken out
    twin: str = ""  # race: the machine provisioned beside it
    replaces: str = ""  # the failed machine whose profile it took
    history: tuple[tuple[float, str, str], ...] = ()  # (time, state, why)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}

    @staticmethod
    def from_dict_untrusted(data: Any) -> Record:
        """From the state log; ValueError for anything that is not a record."""
        if not isinstance(data, dict) or set(data) - Record.__dataclass_fields__.keys():
            raise ValueError("not a machine record")
        try:
            macs = tuple(str(m) for m in data["macs"])
            history = tuple((float(t), str(s), str(w)) for t, s, w in data.get("history", ()))
            record = Record(**{**data, "macs": macs, "history": history,
                               "fetched": tuple(map(str, data.get("fetched", ())))})  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a machine record: {exc}") from None
        if record.state not in STATES or not isinstance(record.name, str) or not record.name:
            raise ValueError(f"not a machine record: state {record.state!r}")
        return record


@dataclass(frozen=True)
class Power:
    name: str
    action: str  # "on", "off", "cycle"


@dataclass
class Actions:
    saves: list[Record] = field(default_factory=list)
    power: list[Power] = field(default_factory=list)
    attempts: int = 0  # provisioning attempts started
    successes: list[float] = field(default_factory=list)  # seconds from request to provisioned
    failures: list[tuple[str, str]] = field(default_factory=list)  # (stage, "timeout"|"installer")
    spares_used: int = 0


class Workflow:
    def __init__(self, timeouts: Timeouts = Timeouts(), retries: int = 2,
                 strategy: str = "retry") -> None:  # fmt: skip
        self.timeouts, self.retries, self.strategy = timeouts, retries, strategy
        self.machines: dict[str, Record] = {}
        self.by_mac: dict[str, str] = {}

    # -- the state (the shell feeds what the log holds) -----------------------------------

    def load(self, record: Record) -> None:
        old = self.machines.get(record.name)
        for mac in old.macs if old else ():
            self.by_mac.pop(mac, None)
        self.machines[record.name] = record
        for mac in record.macs:
            self.by_mac[mac] = record.name

    def forget(self, name: str) -> None:
        old = self.machines.pop(name, None)
        for mac in old.macs if old else ():
            self.by_mac.pop(mac, None)

    def next_deadline(self) -> float | None:
        deadlines = [m.deadline for m in self.machines.values() if m.deadline is not None]
        return min(deadlines, default=None)

    # -- inputs ---------------------------------------------------------------------------

    def request(self, name: str, now: float, profile: str | None = None) -> Actions:
        """Provision ``name`` (again): power it on and wait for each stage."""
        actions = Actions()
        machine = self.machines[name]
        if profile is not None:
            machine = replace(machine, profile=profile)
        self._start(actions, machine, now, "requested by the operator", fresh=True)
        if self.strategy == "race" and not machine.twin:
            spare = self._spare(machine.pool, exclude=name)
            if spare is not None:
                twin = replace(spare, profile=machine.profile, twin=name, replaces="")
                self._start(actions, twin, now, f"racing {name}", fresh=True)
                self._save(actions, replace(self.machines[name], twin=twin.name))
        return actions

    def dhcp(self, mac: str, now: float) -> Actions:
        return self._advance(mac, "discovered", now, "DHCP lease", after=("requested",))

    def fetched(self, mac: str, kind: str, now: float, initrds: int | None = None) -> Actions:
        """``kind``: "loader" (boot script or loader), "kernel", or "initrd:N";
        ``initrds``: how many the machine's profile loads (else its record's count)."""
        if kind == "loader":
            return self._advance(mac, "loader", now, "loader fetched",
                                 after=("requested", "discovered"))  # fmt: skip
        machine = self._machine(mac)
        actions = Actions()
        if machine is None or machine.state not in ("discovered", "loader"):
            return actions
        fetched = tuple(sorted({*machine.fetched, kind}))
        machine = replace(machine, fetched=fetched,
                          initrds=machine.initrds if initrds is None else initrds)  # fmt: skip
        wanted = {"kernel", *(f"initrd:{i}" for i in range(machine.initrds))}
        if wanted <= set(fetched):
            self._enter(actions, machine, "kernel", now, "kernel and initrds fetched")
        else:
            self._save(actions, machine)
        return actions

    def installer(self, mac: str, status: str, now: float, message: str = "") -> Actions:
        """An installer event: ``started``, ``progress``, ``ok`` or ``failed``."""
        machine = self._machine(mac)
        actions = Actions()
        if machine is None or machine.state not in STAGES[:-1]:
            return actions
        if status == "failed":
            why = f"installer failed: {message}"[:200]
            self._failed_attempt(actions, machine, now, "installer", why)
        elif status == "ok":
            self._provisioned(actions, machine, now)
        elif machine.state != "installing":
            self._enter(actions, machine, "installing", now, f"installer {status}")
        else:  # progress: the installer is alive, its deadline starts again
            self._save(actions, replace(machine, deadline=now + self.timeouts.installing))
        return actions

    def tick(self, now: float) -> Actions:
        """Every machine whose deadline passed: a failed attempt."""
        actions = Actions()
        for machine in sorted(self.machines.values(), key=lambda m: (m.deadline or 0, m.name)):
            if machine.deadline is not None and machine.deadline <= now:
                current = self.machines[machine.name]  # an earlier one may have changed it
                if current.deadline is not None and current.deadline <= now:
                    why = f"no progress past {current.state} within {self.timeouts.of(current.state):g} s"
                    self._failed_attempt(actions, current, now, "timeout", why)
        return actions

    # -- transitions ----------------------------------------------------------------------

    def machine_of(self, mac: str) -> Record | None:
        return self._machine(mac)

    def _machine(self, mac: str) -> Record | None:
        name = self.by_mac.get(mac.lower())
        return None if name is None else self.machines[name]

    def _advance(self, mac: str, state: str, now: float, why: str,
                 after: tuple[str, ...]) -> Actions:  # fmt: skip
        actions = Actions()
        machine = self._machine(mac)
        if machine is not None and machine.state in after:
            self._enter(actions, machine, state, now, why)
        return actions

    def _start(self, actions: Actions, machine: Record, now: float, why: str, *,
               fresh: bool) -> None:  # fmt: skip
        if fresh:
            machine = replace(machine, attempt=0, started=now, deprovision=False)
        machine = replace(machine, fetched=())
        actions.attempts += 1
        actions.power.append(Power(machine.name, "cycle" if not fresh else "on"))
        self._enter(actions, machine, "requested", now, why)

    def _enter(self, actions: Actions, machine: Record, state: str, now: float, why: str) -> None:
        timeout = self.timeouts.of(state) if state in STAGES[:-1] else None
        history = (*machine.history, (now, state, why))[-MAX_HISTORY:]
        machine = replace(machine, state=state, since=now, history=history,
                          deadline=None if timeout is None else now + timeout)  # fmt: skip
        self._save(actions, machine)

    def _provisioned(self, actions: Actions, machine: Record, now: float) -> None:
        self._enter(actions, machine, "provisioned", now, "installer done")
        if machine.started is not None:
            actions.successes.append(now - machine.started)
        twin = self.machines.get(machine.twin) if machine.twin else None
        if twin is not None and twin.state in STAGES[:-1]:  # the race is won: release it
            actions.power.append(Power(twin.name, "off"))
            released = replace(twin, twin="", profile="" if twin.pool else twin.profile)
            self._enter(actions, released, "spare" if twin.pool else "idle", now,
                        f"{machine.name} was provisioned first")  # fmt: skip
        if machine.twin:
            self._save(actions, replace(self.machines[machine.name], twin=""))

    def _failed_attempt(self, actions: Actions, machine: Record, now: float, reason: str,
                        why: str) -> None:  # fmt: skip
        actions.failures.append((machine.state, reason))
        if machine.attempt < self.retries:
            machine = replace(machine, attempt=machine.attempt + 1)
            self._start(actions, machine, now, f"retry {machine.attempt}: {why}", fresh=False)
            return
        actions.power.append(Power(machine.name, "off"))
        self._enter(actions, replace(machine, deprovision=True, twin=""), "failed", now, why)
        twin = self.machines.get(machine.twin) if machine.twin else None
        if twin is not None and twin.state in STAGES:
            self._save(actions, replace(twin, twin=""))  # the race goes on with one runner
            return
        if not machine.spare_ok:
            return
        spare = self._spare(machine.pool, exclude=machine.name)
        if spare is not None:
            actions.spares_used += 1
            taken = replace(spare, profile=machine.profile, initrds=machine.initrds,
                            replaces=machine.name)  # fmt: skip
            self._start(actions, taken, now, f"replacing {machine.name}", fresh=True)

    def _spare(self, pool: str, exclude: str) -> Record | None:
        if not pool:
            return None
        idle = [m for m in self.machines.values()
                if m.pool == pool and m.state == "spare" and m.name != exclude]  # fmt: skip
        return min(idle, key=lambda m: m.name, default=None)

    def _save(self, actions: Actions, machine: Record) -> None:
        self.load(machine)
        actions.saves = [m for m in actions.saves if m.name != machine.name] + [machine]
