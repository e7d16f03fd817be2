"""The node lifecycle on the autojump clock: start order, readiness, roles, failures, shutdown."""

from __future__ import annotations

import json
import socket

import pytest
import trio

from appliance.api import Role, Service, hookimpl
from appliance.errors import AlreadyRunning, PluginError
from appliance.node import Node
from tests.support.plugins import configured


class Recorder:
    """A plugin whose services log what happens to them."""

    def __init__(self, events: list, names=("a", "b"), fail: dict | None = None) -> None:
        self.events, self.names, self.fail = events, names, fail or {}

    @hookimpl
    def rackboot_services(self, node):
        return [Service(name, self._runner(name)) for name in self.names]

    @hookimpl
    def rackboot_role_changed(self, node, old, new):
        self.events.append(("role", str(old), str(new)))

    @hookimpl
    def rackboot_status(self, node):
        return {"served": len(self.events)}

    @hookimpl
    def rackboot_control_commands(self, node):
        return {"rec.echo": lambda args: args, "rec.slow": self._slow}

    async def _slow(self, args):
        await trio.sleep(1)
        return "slept"

    def _runner(self, name):
        async def run(node, *, task_status=trio.TASK_STATUS_IGNORED):
            mode = self.fail.get(name)
            await trio.sleep(1)  # binding takes a while; the next service waits for it
            if mode == "before-ready":
                raise OSError(98, "Address already in use")
            if mode == "no-ready":
                return
            self.events.append(("ready", name, trio.current_time()))
            task_status.started()
            try:
                if mode == "after-ready":
                    await trio.sleep(5)
                    raise RuntimeError("socket went away")
                await trio.sleep_forever()
            finally:
                self.events.append(("stopped", name, str(node.role)))

        return run


async def control(path: str, cmd: str, args: dict | None = None) -> dict:
    stream = await trio.open_unix_socket(path)
    async with stream:
        await stream.send_all(json.dumps({"cmd": cmd, "args": args or {}}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


async def test_services_start_in_order_then_node_serves_and_stops(tmp_path, autojump_clock):
    events: list = []
    config, pm = configured(tmp_path, rec=Recorder(events))
    node = Node(config, pm)
    async with trio.open_nursery() as nursery:
        started = await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        assert started is node
        # Each service became ready one after the other; then the node turned active.
        assert events == [("ready", "a", 1.0), ("ready", "b", 2.0), ("role", "standby", "active")]
        assert node.role is Role.ACTIVE
        assert node.service_state == {
            "core.cluster": "running",  # not a member: waits for `cluster init`/`join`
            "core.state": "running",
            "rec.a": "running",
            "rec.b": "running",
        }
        assert (tmp_path / "data" / "node.lock").read_text() != ""

        status = await control(node.control_path, "status")
        assert status["ok"]
        assert status["result"]["core"]["role"] == "active"
        assert status["result"]["core"]["services"] == node.service_state
        assert status["result"]["rec"] == {"served": 3}
        assert (await control(node.control_path, "rec.echo", {"x": 1}))["result"] == {"x": 1}
        assert (await control(node.control_path, "rec.slow"))["result"] == "slept"
        unknown = await control(node.control_path, "nope")
        assert unknown == {"ok": False, "error": unknown["error"]}
        assert "unknown command 'nope'" in unknown["error"] and "rec.echo" in unknown["error"]

        node.request_stop("test")
    # Stepped down before any service was cancelled; services saw role standby.
    assert events[3] == ("role", "active", "standby")
    assert sorted(events[4:]) == [("stopped", "a", "standby"), ("stopped", "b", "standby")]
    assert not (tmp_path / "data" / "control.sock").exists()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (
            "before-ready",
            "plugin 'rec': service 'rec.a' failed to start: address already in use"
            " (EADDRINUSE: another program or service has it)",
        ),
        ("no-ready", "plugin 'rec': service 'rec.a' returned without becoming ready"),
    ],
)
async def test_service_failing_to_start_stops_the_node_named(
    tmp_path, autojump_clock, mode, message
):
    events: list = []
    config, pm = configured(tmp_path, rec=Recorder(events, fail={"a": mode}))
    node = Node(config, pm)
    with pytest.raises(PluginError) as info:
        await node.run(handle_signals=False)
    assert str(info.value) == message
    # Never half-started: b never ran, the node never became active.
    assert events == []
    assert node.role is Role.STANDBY
    assert not (tmp_path / "data" / "control.sock").exists()
    # The data directory lock was released: a new node can start.
    Node(config, pm)._prepare_data_dir()


async def test_service_failing_later_stops_the_node_after_stepping_down(tmp_path, autojump_clock):
    events: list = []
    config, pm = configured(tmp_path, rec=Recorder(events, fail={"b": "after-ready"}))
    node = Node(config, pm)
    with pytest.raises(PluginError, match="service 'rec.b' failed: RuntimeError: socket went away"):
        await node.run(handle_signals=False)
    assert ("role", "active", "standby") in events
    assert events.index(("role", "active", "standby")) < events.index(("stopped", "a", "standby"))
    assert node.service_state["rec.b"] == "failed"


async def test_second_node_on_same_data_dir_is_refused(tmp_path, autojump_clock):
    config, pm = configured(tmp_path, rec=Recorder([]))
    first = Node(config, pm)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: first.run(handle_signals=False, task_status=task_status)
        )
        with pytest.raises(AlreadyRunning, match="another node is running with data directory"):
            await Node(config, pm).run(handle_signals=False)
        # The refused node did not disturb the running one.
        assert (await control(first.control_path, "ping"))["result"] == "pong"
        first.request_stop()


async def test_stale_control_socket_is_replaced(tmp_path, autojump_clock):
    config, pm = configured(tmp_path)
    (tmp_path / "data").mkdir()
    stale = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await stale.bind(str(tmp_path / "data" / "control.sock"))
    stale.close()  # the file stays, nobody listens: a node that died
    node = Node(config, pm)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        assert (await control(node.control_path, "ping"))["result"] == "pong"
        node.request_stop()


async def test_bad_services_and_commands_are_named(tmp_path, autojump_clock):
    class NotAService:
        @hookimpl
        def rackboot_services(self, node):
            return ["run me"]

    config, pm = configured(tmp_path, odd=NotAService())
    with pytest.raises(
        PluginError, match="plugin 'odd': rackboot_services returned 'run me', expected Service"
    ):
        await Node(config, pm).run(handle_signals=False)

    class Squatter:
        @hookimpl
        def rackboot_control_commands(self, node):
            return {"status": lambda args: "mine"}

    config, pm = configured(tmp_path, squat=Squatter())
    with pytest.raises(
        PluginError, match="plugin 'squat': control command 'status' is already taken"
    ):
        await Node(config, pm).run(handle_signals=False)


async def test_a_raising_status_hook_is_reported_beside_the_others(tmp_path, autojump_clock):
    class Broken:
        @hookimpl
        def rackboot_status(self, node):
            raise KeyError("gone")

    class Failing:
        @hookimpl
        def rackboot_control_commands(self, node):
            def refuse(args):
                raise PluginError("plugin 'fail': no such lease")

            return {"fail.cmd": refuse}

    config, pm = configured(tmp_path, rec=Recorder([]), broken=Broken(), fail=Failing())
    node = Node(config, pm)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        status = (await control(node.control_path, "status"))["result"]
        assert status["broken"] == {
            "error": "plugin 'broken' failed in rackboot_status: KeyError: 'gone'"
        }
        assert status["rec"] == {"served": 3} and status["core"]["role"] == "active"
        # An operator-facing error from a command reaches the client as it is.
        reply = await control(node.control_path, "fail.cmd")
        assert reply == {"ok": False, "error": "plugin 'fail': no such lease"}
        node.request_stop()


async def test_ready_is_told_to_systemd_and_in_status_once_every_service_serves(
    tmp_path, autojump_clock, monkeypatch
):
    """sd_notify: READY=1 only after the last service started (not when the process or
    its control socket exists), STOPPING=1 at the stop; status says ready the same way."""
    notify_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    listener.setblocking(False)

    async def told() -> str:
        await trio.lowlevel.wait_readable(listener)
        return listener.recv(4096).decode()

    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_path))
    events: list = []
    config, pm = configured(tmp_path, rec=Recorder(events))
    node = Node(config, pm)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: node.run(handle_signals=False))
        # Service "a" still starting (each takes 1 s). Asked without awaiting real I/O:
        # the autojump clock would run the services on while a socket round trip waits.
        await trio.sleep(0.5)
        assert node.status()["core"]["ready"] is False
        with pytest.raises(BlockingIOError):
            listener.recv(1)  # nothing told yet
        assert await told() == "READY=1\nSTATUS=serving as active"
        assert [e[0] for e in events][:3] == ["ready", "ready", "role"]  # after every service
        assert (await control(node.control_path, "status"))["result"]["core"]["ready"] is True
        node.request_stop("test")
        assert await told() == "STOPPING=1"
    listener.close()


def test_notify_does_nothing_without_systemd(tmp_path):
    from appliance.sdnotify import notify

    assert notify("READY=1", {}) is False
    assert notify("READY=1", {"NOTIFY_SOCKET": "relative/path"}) is False
    assert notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}) is False  # logged
