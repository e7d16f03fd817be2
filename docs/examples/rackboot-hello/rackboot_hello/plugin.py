"""The hello plugin: one hook implementation per part of a plugin's life.

The core loads this module through the entry point in ``pyproject.toml``
and registers it under the entry point's name, ``hello``. Every function
marked ``@hookimpl`` implements a hook of :mod:`appliance.hookspecs` (or of
this plugin's own :mod:`rackboot_hello.hookspecs`). Hooks are synchronous;
the only ``async`` code is the service the core starts.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import TYPE_CHECKING, Any

import trio
from appliance.api import Field, Int, Section, Service, Str, get_logger, hookimpl

from rackboot_hello import hookspecs

if TYPE_CHECKING:
    import pluggy
    from appliance.node import Node

HOST = "127.0.0.1"
SEND_TIMEOUT = 5.0  # seconds a client may take to accept one line

log = get_logger("hello")


# -------------------------------------------------------------------------
# Initialization: our own hooks and our configuration section
# -------------------------------------------------------------------------


@hookimpl
def rackboot_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    # Historic: called for us even though we register after the core called it.
    pluginmanager.add_hookspecs(hookspecs)


SECTION = Section(
    "hello",
    doc="The example hello plugin: greets every TCP client on 127.0.0.1 with one line.",
    fields={
        "port": Field(
            Int(min=0, max=65535),
            default=0,
            doc="TCP port on 127.0.0.1 (0: any free port; `rackboot status` shows which).",
        ),
        "greeting": Field(
            Str(r"[^\r\n]{1,200}", "one line of text (1 to 200 characters)"),
            default="hello from rackboot",
            doc="The line sent to each client (another plugin may override it).",
        ),
    },
)


@hookimpl
def rackboot_config_schema() -> Section:
    # The core validates [hello] against this before any service starts, and
    # `rackboot config example` renders it.
    return SECTION


# -------------------------------------------------------------------------
# Running: one service per node
# -------------------------------------------------------------------------


class Greeter:
    """The state of one node's hello service, read by ``rackboot_status``."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.served = 0

    async def run(self, node: Node, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        settings = node.config["hello"]
        listeners = await trio.open_tcp_listeners(settings.port, host=HOST)
        try:
            self.port = listeners[0].socket.getsockname()[1]
            log.info("listening", address=HOST, port=self.port)
            # Ready only now that the socket is bound: the core starts the
            # next service, and becomes active, after this call.
            task_status.started()
            await trio.serve_listeners(partial(self._greet, node), listeners)
        finally:
            for listener in listeners:
                listener.socket.close()  # synchronous: safe while cancelled

    async def _greet(self, node: Node, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                host, port = stream.socket.getpeername()[:2]
            except OSError:
                return  # reset before we got to it; an exception here would stop the service
            try:
                greeting = node.pm.hook.hello_greeting(node=node, peer=f"{host}:{port}")
            except Exception as exc:  # another plugin's bug must not stop the service
                log.error("hello_greeting failed", error=f"{type(exc).__name__}: {exc}")
                return
            line = " ".join(str(greeting).splitlines())  # exactly one line on the wire
            with trio.move_on_after(SEND_TIMEOUT) as scope:
                try:
                    await stream.send_all(line.encode() + b"\n")
                except trio.BrokenResourceError:
                    return  # the client went away first
            if not scope.cancelled_caught:
                self.served += 1


# One Greeter per node; weak so a finished node (in tests) is forgotten.
_greeters: weakref.WeakKeyDictionary[Node, Greeter] = weakref.WeakKeyDictionary()


@hookimpl
def rackboot_services(node: Node) -> list[Service]:
    greeter = Greeter()
    _greeters[node] = greeter
    # Started as "hello.greeter" with `await nursery.start(greeter.run, node)`.
    return [Service("greeter", greeter.run)]


@hookimpl(trylast=True)
def hello_greeting(node: Node, peer: str) -> str:
    # Our own hook, implemented last: the default another plugin can override.
    return node.config["hello"].greeting


# -------------------------------------------------------------------------
# Observing: what `rackboot status` shows under "hello"
# -------------------------------------------------------------------------


@hookimpl
def rackboot_status(node: Node) -> dict[str, Any] | None:
    greeter = _greeters.get(node)
    if greeter is None:
        return None
    return {"address": HOST, "port": greeter.port, "connections": greeter.served}
