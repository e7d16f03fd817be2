"""The node: one nursery tree that runs every plugin service under ``trio.run``.

Lifecycle: take the data directory's lock, bind the control socket, start
each service with ``await nursery.start`` (ready = sockets bound), become
active, serve until SIGTERM/SIGINT, step down (plugins stop outward effects
first), cancel services, release everything. A service that fails before it
is ready stops the node with an error that names it: never a half-started node.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import fcntl
import io
import logging
import os
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

import prometheus_client
import trio

from appliance import compat, control, controlserver
from appliance.api import Role, Service
from appliance.config import Config, Listening
from appliance.errors import AlreadyRunning, PluginError, RackbootError, describe_os_error
from appliance.ha.fence import FOREVER, Fence
from appliance.logs import get_logger
from appliance.pluginmanager import RackbootPluginManager, call_each
from appliance.sdnotify import notify

log = get_logger("node")

# How long past shutdown_grace a stuck shutdown may take before the process
# dumps every thread's stack and exits (faulthandler's watchdog).
SHUTDOWN_WATCHDOG_SLACK = 5.0


class Node:
    def __init__(self, config: Config, pm: RackbootPluginManager) -> None:
        self.config = config
        self.pm = pm
        self.data_dir = Path(config.node.data_dir)
        self.control_path = config.node.control_socket or str(self.data_dir / "control.sock")
        self.shutdown_grace: float = config.node.shutdown_grace
        self.role = Role.STANDBY
        self.services: list[Service] = []
        self.service_state: dict[str, str] = {}
        self.stopping = trio.Event()
        self.ready = False  # every service started, not stopping: status and sd_notify say it
        # Plugins register their Prometheus metrics here (never the global
        # registry: tests run many nodes in one process).
        self.metrics = prometheus_client.CollectorRegistry()
        self._started_at = 0.0
        self._lock_fd: int | None = None
        # The cluster service (appliance.cluster.service.Cluster), made by the core plugin.
        self.cluster: Any = None
        # The version and protocol ranges this node states to others (appliance/compat.py;
        # tests give two nodes different ones).
        self.speaks = compat.THIS
        # The fencing guard plugins ask before an outward effect (appliance/ha/fence.py),
        # and the HA service (appliance.ha.service) when [ha] names peers: it then
        # decides the role, and the node no longer makes itself active.
        self.fence = Fence(trio.current_time)
        self.ha: Any = None
        # The state store (appliance/state): what plugins keep across restarts and failovers.
        self.state: Any = None
        self.replication: Any = None  # its streams, when [ha] names peers
        self.handle_signals = True

    # -- for plugins ------------------------------------------------------

    def uptime(self) -> float:
        return trio.current_time() - self._started_at

    def plugin_dir(self, plugin: str) -> Path:
        """A plugin's own state directory under the data directory (created 0700)."""
        path = self.data_dir / plugin
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    def request_stop(self, reason: str = "requested") -> None:
        if not self.stopping.is_set():
            log.info("stopping", reason=reason)
            self.stopping.set()

    def status(self) -> dict[str, Any]:
        """Every plugin's contribution; one that raises reports its error
        instead of hiding everyone else's status."""

        def failed(exc: PluginError) -> dict[str, str]:
            log.error("status hook failed", error=str(exc))
            return {"error": str(exc)}

        return {
            name: result
            for name, result in call_each(self.pm, "rackboot_status", on_error=failed, node=self)
            if result is not None
        }

    # -- lifecycle --------------------------------------------------------

    async def run(
        self, *, handle_signals: bool = True, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            await self._run(handle_signals, task_status)
        except BaseExceptionGroup as group:
            # trio nurseries wrap every error in a group; the operator gets the
            # one that says what went wrong, with its exit code.
            raise _sole_cause(group) from None

    async def _run(self, handle_signals: bool, task_status) -> None:
        # The clock object itself, not trio.current_time: the fence may be asked from a
        # worker thread (TFTP's pump) and must read the same clock as the election.
        self.fence.clock = trio.lowlevel.current_clock().current_time
        self._started_at = trio.current_time()
        self.handle_signals = handle_signals
        self._prepare_data_dir()
        try:
            self.services = self._collect_services()
            handlers = self._control_handlers()
            sock = await controlserver.bind_control_socket(self.control_path)
            try:
                async with trio.open_nursery() as root:
                    if handle_signals:
                        await root.start(self._watch_signals)
                    await root.start(controlserver.serve_control, sock, handlers)
                    try:
                        async with trio.open_nursery() as services:
                            await self._start_services(services)
                            if self.ha is None or not self.ha.elects:
                                self._set_role(Role.ACTIVE)
                            log.info(
                                "ready",
                                node=self.config.node.name,
                                role=str(self.role),
                                services=len(self.services),
                                control=self.control_path,
                            )
                            self.ready = True
                            notify(f"READY=1\nSTATUS=serving as {self.role}")
                            task_status.started(self)
                            await self.stopping.wait()
                            self.ready = False
                            notify("STOPPING=1")
                            _arm_shutdown_watchdog(self.shutdown_grace + SHUTDOWN_WATCHDOG_SLACK)
                            self._set_role(Role.STANDBY)
                            services.cancel_scope.cancel()
                    finally:
                        # Step down before anything else goes, even when a service failed.
                        self._set_role(Role.STANDBY)
                    root.cancel_scope.cancel()
            finally:
                sock.close()
                _unlink_quietly(self.control_path)
                faulthandler.cancel_dump_traceback_later()
        finally:
            self._release_lock()
        log.info("stopped", node=self.config.node.name)

    def _prepare_data_dir(self) -> None:
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.data_dir / "node.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise RackbootError(
                f"cannot use data directory {self.data_dir}: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(
                f"another node is running with data directory {self.data_dir}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _collect_services(self) -> list[Service]:
        services: list[Service] = []
        for plugin, result in call_each(self.pm, "rackboot_services", node=self):
            for svc in result or ():
                if not isinstance(svc, Service):
                    raise PluginError(
                        f"plugin {plugin!r}: rackboot_services returned {svc!r}, expected Service objects"
                    )
                services.append(Service(f"{plugin}.{svc.name}", svc.run, plugin))
        names = [s.name for s in services]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise PluginError(f"duplicate service names: {', '.join(sorted(duplicates))}")
        for svc in services:
            self.service_state[svc.name] = "pending"
        return services

    async def _start_services(self, nursery: trio.Nursery) -> None:
        for svc in self.services:
            self.service_state[svc.name] = "starting"
            try:
                await nursery.start(self._run_service, svc)
            except (RackbootError, trio.Cancelled):
                raise
            except Exception as exc:
                self.service_state[svc.name] = "failed"
                raise self._start_failure(svc, exc)  # noqa: B904 (its cause is set)
            log.info("service ready", service=svc.name)

    def _start_failure(self, svc: Service, exc: Exception) -> RackbootError:
        """One line for a service that failed before it was ready: the leaves of the
        exception groups its nurseries wrapped them in, each an address and port or a
        file and the reason; a RackbootError inside keeps its own message and exit code."""
        if log.isEnabledFor(logging.DEBUG):  # where it failed, for --log-level debug
            trace = "".join(traceback.format_exception(exc))
            log.debug("service failed to start", service=svc.name, traceback=trace)
        leaves = _leaves(exc)
        for leaf in leaves:
            if isinstance(leaf, RackbootError):
                return leaf
        listening = [entry for entry in self.config.listening if entry.owner == svc.plugin]
        reasons = dict.fromkeys(_describe_leaf(leaf, listening) for leaf in leaves or [exc])
        error = PluginError(
            f"plugin {svc.plugin!r}: service {svc.name!r} failed to start: {'; '.join(reasons)}"
        )
        error.__cause__ = exc  # a leaf raised as it is keeps its own cause
        return error

    async def _run_service(self, svc: Service, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        started = False

        def ready(value: Any = None) -> None:
            nonlocal started
            started = True
            self.service_state[svc.name] = "running"
            task_status.started(value)

        class _Status:
            started = staticmethod(ready)

        try:
            await svc.run(self, task_status=_Status())
        except Exception as exc:
            if not started:
                raise
            self.service_state[svc.name] = "failed"
            log.error("service failed", service=svc.name, error=f"{type(exc).__name__}: {exc}")
            # Step down now: raising cancels the sibling services at once, and
            # they must stop outward effects first.
            self._set_role(Role.STANDBY)
            self.request_stop(f"service {svc.name} failed")
            raise PluginError(
                f"plugin {svc.plugin!r}: service {svc.name!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        else:
            if not started:
                raise PluginError(
                    f"plugin {svc.plugin!r}: service {svc.name!r} returned without becoming ready"
                )
            self.service_state[svc.name] = "stopped"

    def set_role(self, new: Role, *, valid_until: float = FOREVER, epoch: int = 0) -> None:
        """Become ``new``; active until ``valid_until`` (the lease's end), as the election says."""
        if new is Role.ACTIVE:
            self.fence.grant(valid_until, epoch)
        self._set_role(new)

    def _set_role(self, new: Role) -> None:
        if new is Role.STANDBY:
            self.fence.revoke()  # before any plugin hears of it
        elif self.fence.valid_until == -FOREVER:
            # A standalone node holds an endless lease, under its log's newest epoch: the
            # store refuses a writer older than its log (one written under an election's
            # epoch, or restored from a rack's backup).
            self.fence.grant(FOREVER, self.state.position.epoch if self.state is not None else 0)
        old, self.role = self.role, new
        if old is not new:
            log.info("role changed", old=str(old), new=str(new))
            if self.ready:
                notify(f"STATUS=serving as {new}")
            call_each(self.pm, "rackboot_role_changed", node=self, old=old, new=new)

    def _control_handlers(self) -> dict[str, control.Handler]:
        handlers: dict[str, control.Handler] = {
            "ping": lambda args: "pong",
            "status": lambda args: self.status(),
            "metrics": lambda args: prometheus_client.generate_latest(self.metrics).decode(),
        }
        for plugin, commands in call_each(self.pm, "rackboot_control_commands", node=self):
            for name, handler in (commands or {}).items():
                if name in handlers:
                    raise PluginError(
                        f"plugin {plugin!r}: control command {name!r} is already taken"
                    )
                handlers[name] = handler
        return handlers

    async def _watch_signals(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for signum in signals:
                if self.stopping.is_set():
                    log.error(
                        "second signal during shutdown: exiting now",
                        signal=signal.Signals(signum).name,
                    )
                    sys.stderr.flush()
                    os._exit(1)
                self.request_stop(signal.Signals(signum).name)


def _sole_cause(group: BaseExceptionGroup) -> BaseException:
    """The error to report from a nursery's group: its first RackbootError,
    else its only non-cancellation leaf, else the group itself."""
    leaves = _leaves(group)
    for leaf in leaves:
        if isinstance(leaf, RackbootError):
            return leaf
    return leaves[0] if len(leaves) == 1 else group


def _leaves(exc: BaseException) -> list[BaseException]:
    """The errors inside (nested) exception groups, cancellations left out."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [] if isinstance(exc, trio.Cancelled) else [exc]


def _describe_leaf(leaf: BaseException, listening: list[Listening]) -> str:
    if not isinstance(leaf, OSError):
        return f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__
    culprit = None if leaf.filename is not None else _failing_listener(leaf, listening)
    if culprit is None:
        return describe_os_error(leaf)
    return describe_os_error(leaf, culprit.address, culprit.port, culprit.keypath)


def _failing_listener(exc: OSError, listening: list[Listening]) -> Listening | None:
    """Which declared listener a bind error came from: the OSError does not say, so ask
    the kernel again (the service's own sockets are closed by now)."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        privileged = [entry for entry in listening if entry.port < _unprivileged_port_start()]
        return privileged[0] if privileged else None
    if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
        return None
    for entry in listening:
        kind = socket.SOCK_DGRAM if entry.protocol == "udp" else socket.SOCK_STREAM
        with socket.socket(socket.AF_INET, kind) as probe:
            if kind == socket.SOCK_STREAM:  # as trio's listeners do: TIME_WAIT is no clash
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((entry.address, entry.port))
            except OSError as again:
                if again.errno == exc.errno:
                    return entry
    return listening[0] if len(listening) == 1 else None


def _unprivileged_port_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 1024


def _arm_shutdown_watchdog(timeout: float) -> None:
    """Dump every stack and exit if shutdown hangs; not possible when stderr
    is not a real file (embedded runs, captured output)."""
    try:
        faulthandler.dump_traceback_later(timeout, exit=True)
    except (io.UnsupportedOperation, ValueError, AttributeError):
        log.debug("no shutdown watchdog: stderr has no file descriptor")


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
