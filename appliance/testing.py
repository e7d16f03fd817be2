"""Testing a plugin without root: a node in-process on loopback, and client drivers.

This module is the pytest plugin ``rackboot`` (the ``pytest11`` entry point of the
``rackboot`` distribution): installed with Rackboot, pytest loads it by itself and
its fixture is there in any test; ``-p no:rackboot`` leaves it out.

    def test_my_option(rackboot_node):
        node = rackboot_node(plugins=["dhcp", "myplugin"], config={"myplugin": {...}})
        ack = node.dhcp.dora("52:54:00:00:00:01", params=[125])
        assert ack.options[125] == ...

A node runs the real core and the real plugins, loaded through their entry points
as ``rackboot run`` loads them, with the standalone development defaults (loopback,
unprivileged ports: DHCP on a free port, TFTP and HTTP on port 0), its data under
pytest's ``tmp_path``, in a thread of its own with its own trio run. Tests stay
plain synchronous functions: the drivers are blocking clients, and
:meth:`RunningNode.call` runs a function in the node's trio thread. Drivers come
through the ``rackboot.testing`` entry points (the core knows no protocol): ``dhcp``,
``tftp`` and ``httpboot`` are Rackboot's own; a plugin may add its own.

One node at a time: the built-in plugin objects are loaded once per process and keep
their node, as in ``rackboot run``.
"""

from __future__ import annotations

import importlib.metadata
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from appliance.api import ENTRY_POINT_GROUP

DRIVER_GROUP = "rackboot.testing"
DEFAULT_PLUGINS = ("dhcp", "tftp", "httpboot")
START_TIMEOUT = 30.0  # seconds a node may take to start (a loaded CI machine)
STOP_TIMEOUT = 15.0  # seconds past its shutdown_grace a node may take to stop
POLL = 0.02  # seconds between two looks of wait_for

_running: list[RunningNode] = []  # one node at a time (see the module's doc)


class RunningNode:
    """A started node: its status and control commands, code in its trio thread, drivers."""

    def __init__(self, node: Any, token: Any, thread: threading.Thread, done: threading.Event,
                 failure: list[BaseException]) -> None:  # fmt: skip
        self.node = node  # appliance.node.Node: read it in its thread (call)
        self.config = node.config
        self.data_dir: Path = node.data_dir
        self._token, self._thread, self._done, self._failure = token, thread, done, failure
        self._drivers: dict[str, Any] = {}

    # -- asking the node ----------------------------------------------------------

    def control(self, command: str, args: Mapping[str, Any] | None = None,
                timeout: float = 10.0) -> Any:  # fmt: skip
        """A control command through the node's real control socket, as the CLI sends it
        (``rackboot status --json`` is ``control("status")``)."""
        from appliance import control

        return control.call(self.node.control_path, command, dict(args or {}), timeout=timeout)

    def status(self) -> dict[str, Any]:
        return self.control("status")

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in the node's trio thread (read ``node.state``, call hooks),
        its result or its exception here."""
        import trio

        return trio.from_thread.run_sync(function, *args, trio_token=self._token)

    def acall(self, function: Callable[..., Any], *args: Any) -> Any:
        """``await function(*args)`` in the node's trio run."""
        import trio

        return trio.from_thread.run(function, *args, trio_token=self._token)

    def wait_for(self, predicate: Callable[[dict[str, Any]], Any], timeout: float = 10.0,
                 what: str = "") -> Any:  # fmt: skip
        """Poll the status until ``predicate(status)`` is true (bounded): its value."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            value = predicate(status)
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"not within {timeout} s: {what or predicate}; status: {status}")
            time.sleep(POLL)

    def listening(self, plugin: str) -> tuple[str, int]:
        """The first ``host:port`` a plugin's status lists under ``listening``."""
        host, _, port = self.status()[plugin]["listening"][0].rpartition(":")
        return host, int(port)

    # -- drivers ------------------------------------------------------------------

    def driver(self, name: str) -> Any:
        """The client driver registered as ``name`` in the ``rackboot.testing`` entry-point
        group, made for this node (once)."""
        if name not in self._drivers:
            found = [ep for ep in importlib.metadata.entry_points(group=DRIVER_GROUP)
                     if ep.name == name]  # fmt: skip
            if not found:
                known = sorted(
                    ep.name for ep in importlib.metadata.entry_points(group=DRIVER_GROUP)
                )
                raise LookupError(f"no test driver {name!r} (installed: {', '.join(known)})")
            self._drivers[name] = found[0].load()(self)
        return self._drivers[name]

    @property
    def dhcp(self) -> Any:
        """A DHCP client aimed at this node (plugins.dhcp.testclient.DhcpClient)."""
        return self.driver("dhcp")

    @property
    def tftp(self) -> Any:
        """A TFTP client aimed at this node (plugins.tftp.testclient.TftpClient)."""
        return self.driver("tftp")

    @property
    def http(self) -> Any:
        """An HTTP client aimed at this node (plugins.httpboot.testclient.HttpClient)."""
        return self.driver("httpboot")

    # -- stopping -----------------------------------------------------------------

    def stop(self) -> None:
        """Stop the node as SIGTERM does and wait for it; raise what it failed with (once:
        stopping again does nothing)."""
        import trio

        if self not in _running:
            return
        _running.remove(self)
        if not self._done.is_set():
            try:
                trio.from_thread.run_sync(self.node.request_stop, "test", trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(self.node.shutdown_grace + STOP_TIMEOUT)
        if self._thread.is_alive():
            raise RuntimeError(
                f"the node did not stop within {self.node.shutdown_grace + STOP_TIMEOUT} s"
            )
        if self._failure:
            raise self._failure[0]


def start_node(
    data: Path,
    plugins: Iterator[str] | list[str] | tuple[str, ...] = DEFAULT_PLUGINS,
    config: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> RunningNode:
    """Start a node whose state lives under ``data``, with the installed plugins named in
    ``plugins`` (the others disabled, as ``[plugins] disabled`` does), plugin objects of
    ``extra`` registered by name beside them, and ``config`` (one table per section)
    over the development defaults. Returns once every service is ready."""
    from appliance.clock import BoottimeClock
    from appliance.node import Node

    if _running:
        raise RuntimeError("a node is running already: stop it first (one node at a time)")
    config_, pm = configure(data, list(plugins), config or {}, extra or {})
    node = Node(config_, pm)
    ready, done = threading.Event(), threading.Event()
    failure: list[BaseException] = []
    token: list[Any] = []

    class Ready:  # what node.run tells once every service started
        @staticmethod
        def started(value: Any = None) -> None:
            ready.set()

    async def main() -> None:
        import trio

        token.append(trio.lowlevel.current_trio_token())
        # node.run raises the one error that says what went wrong, not its nursery's group.
        await node.run(handle_signals=False, task_status=Ready())

    def thread_main() -> None:
        import trio

        try:
            trio.run(main, clock=BoottimeClock())
        except BaseException as exc:  # told to the test thread
            failure.append(exc)
        finally:
            done.set()
            ready.set()

    thread = threading.Thread(target=thread_main, name=f"rackboot-node-{config_.node.name}",
                              daemon=True)  # fmt: skip
    thread.start()
    if not ready.wait(START_TIMEOUT):
        raise RuntimeError(f"the node did not start within {START_TIMEOUT} s")
    if failure:
        raise failure[0]
    running = RunningNode(node, token[0], thread, done, failure)
    _running.append(running)
    return running


def configure(data: Path, plugins: list[str], document: Mapping[str, Any],
              extra: Mapping[str, Any]) -> tuple[Any, Any]:  # fmt: skip
    """The validated configuration and plugin manager, as ``rackboot run`` makes them."""
    from appliance.config import validate
    from appliance.pluginmanager import build_plugin_manager, call_each, collect_sections

    installed = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
    unknown = sorted(set(plugins) - set(installed))
    if unknown:
        raise LookupError(f"no installed plugin {unknown[0]!r} (installed: {', '.join(installed)})")
    disabled = [name for name in installed if name not in plugins]
    pm = build_plugin_manager(disabled)
    for name, plugin in extra.items():
        pm.register(plugin, name=name)
    pm.check_pending()
    merged = _with_test_defaults(data, plugins, document)
    sections = collect_sections(pm)
    config = validate("<rackboot.testing>", merged, sections, dev=True,
                      ignored_sections=frozenset(disabled))  # fmt: skip
    call_each(pm, "rackboot_configure", config=config)
    return config, pm


def _with_test_defaults(data: Path, plugins: list[str], document: Mapping[str, Any]) -> dict:
    """``document`` over what keeps a test node to itself: its data under ``data``, free
    ports for what it serves (DHCP needs a fixed one: its clients send to it)."""
    defaults: dict[str, dict[str, Any]] = {
        "node": {"name": "test-node", "data_dir": str(data), "shutdown_grace": 2.0},
        "dhcp": {"port": free_udp_port()},
        "tftp": {"port": 0},
        "httpboot": {"port": 0},
    }
    merged: dict[str, Any] = {}
    for section, table in defaults.items():
        if section == "node" or section in plugins:
            merged[section] = dict(table)
    for section, table in document.items():
        merged[section] = {**merged.get(section, {}), **table} if isinstance(table, dict) else table
    return merged


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the pytest plugin ---------------------------------------------------------------


@pytest.fixture
def rackboot_node(tmp_path: Path) -> Iterator[Callable[..., RunningNode]]:
    """Start a node: ``rackboot_node(plugins=[...], config={...}, extra={...})`` (see
    :func:`start_node`), its data in ``tmp_path/node`` unless ``data`` says otherwise (a
    node started again after :meth:`RunningNode.stop` finds its state, as after a
    restart); stopped at the end of the test, which fails if the node did."""
    started: list[RunningNode] = []

    def start(plugins=DEFAULT_PLUGINS, config=None, extra=None, data=None) -> RunningNode:
        running = start_node(data or tmp_path / "node", plugins, config, extra)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()
