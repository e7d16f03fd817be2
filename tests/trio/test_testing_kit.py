"""rackboot.testing (appliance/testing.py), the kit plugin authors test with: a real node
in a thread of its own on loopback, its drivers, and the errors it reports. The template
plugin's own tests use it end to end (tests/real/test_template_plugin.py)."""

from __future__ import annotations

import socket
import threading

import pytest
import trio

from appliance.api import Service, hookimpl
from appliance.errors import PluginError
from appliance.testing import start_node
from plugins.dhcp.options import MessageType

MAC = "52:54:00:00:00:01"


class Extension:
    """What a third-party plugin would do, registered inline."""

    def __init__(self) -> None:
        self.events: list = []
        self.fail = trio.Event()

    @hookimpl(optionalhook=True)
    def dhcp_reply_options(self, request, reply, lease):
        reply.options[224] = b"private"

    @hookimpl(optionalhook=True)
    def tftp_open(self, path, client, node):
        return f"for {client.address}\n".encode() if path == "dynamic.txt" else None

    @hookimpl(optionalhook=True)
    def httpboot_machine_event(self, event):
        self.events.append((event.mac, event.stage, event.status))

    @hookimpl
    def rackboot_services(self, node):
        async def run(node, task_status):
            task_status.started()
            await self.fail.wait()
            raise RuntimeError("broken on purpose")

        return [Service("watch", run)]


def test_a_node_answers_dhcp_tftp_and_http_through_the_drivers(rackboot_node):
    extension = Extension()
    node = rackboot_node(
        extra={"ext": extension}, config={"httpboot": {"bind_tokens_to_lease": True}}
    )
    ack = node.dhcp.dora(MAC)
    assert ack.message_type is MessageType.ACK and ack.options[224] == b"private"
    assert str(ack.yiaddr).startswith("127.0.100.")
    assert node.tftp.get("dynamic.txt") == b"for 127.0.0.1\n"
    (node.data_dir / "tftp" / "root" / "big").write_bytes(bytes(range(256)) * 40)
    assert node.tftp.get("big", blksize=1400) == bytes(range(256)) * 40
    assert node.tftp.error("missing") == (1, "missing: file not found")
    # The script only from the lease's address; an event with its token is announced.
    assert node.http.get("/boot/52-54-00-00-00-01.ipxe").status == 404
    boot = node.http.script(MAC, source=str(ack.yiaddr))
    assert node.http.event(boot, "install", "ok").status == 201
    assert extension.events == [(MAC, "install", "ok")]
    # Status and control through the real control socket; code in the node's thread.
    assert node.status()["core"]["ready"] is True
    assert [lease["mac"] for lease in node.control("dhcp.leases")] == [MAC]
    assert node.call(lambda: threading.current_thread().name) == "rackboot-node-test-node"


def test_a_node_that_fails_while_running_fails_its_test(rackboot_node):
    extension = Extension()
    node = rackboot_node(plugins=["tftp"], extra={"ext": extension})
    node.call(extension.fail.set)
    with pytest.raises(
        PluginError, match="service 'ext.watch' failed: RuntimeError: broken on purpose"
    ):
        node.stop()


def test_a_service_that_cannot_start_is_named(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PluginError, match="service 'httpboot.server' failed to start"):
            start_node(tmp_path, ["httpboot"], {"httpboot": {"port": port}})


def test_unknown_names_and_a_second_node_are_refused(rackboot_node, tmp_path):
    with pytest.raises(LookupError, match=r"no installed plugin 'nope' \(installed: dhcp, "):
        rackboot_node(plugins=["nope"])
    node = rackboot_node(plugins=["tftp"])
    with pytest.raises(LookupError, match="no test driver 'nope'"):
        node.driver("nope")
    with pytest.raises(RuntimeError, match="one node at a time"):
        start_node(tmp_path / "other", ["tftp"])
