"""The tftp plugin inside a node: configuration, the service, the hook, status, metrics."""

from __future__ import annotations

import ipaddress

import prometheus_client
import pytest
import trio

from appliance.api import hookimpl
from appliance.errors import ConfigError
from appliance.node import Node
from plugins.tftp import plugin as tftp_plugin
from plugins.tftp.plugin import server_config
from tests.support.plugins import configured
from tests.support.tftp import fetch


class Dynamic:
    @hookimpl
    def tftp_open(self, path, client):
        if path == "hello.ipxe":
            return f"#!ipxe\necho {client.address}\n".encode()
        return None


class Observer:
    def __init__(self, fail: bool = False) -> None:
        self.seen: list[tuple[str, str]] = []
        self.fail = fail

    @hookimpl
    def tftp_file_served(self, path, client):
        self.seen.append((path, client))
        if self.fail:
            raise RuntimeError("an observer's bug")


async def test_observers_see_each_file_served_to_its_end_and_not_refusals(tmp_path):
    seen, broken = Observer(), Observer(fail=True)
    config, pm = configured(tmp_path, {"tftp": {"port": 0}}, tftp=tftp_plugin, dyn=Dynamic(),
                            seen=seen, broken=broken)  # fmt: skip
    node = Node(config, pm)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: node.run(handle_signals=False, task_status=task_status)
            )
            (tmp_path / "data" / "tftp" / "root" / "vmlinuz").write_bytes(b"k" * 5000)
            host, port = node.status()["tftp"]["listening"][0].split(":")
            addr = (host, int(port))
            assert (await fetch(addr, "/vmlinuz")).data == b"k" * 5000
            assert (await fetch(addr, "hello.ipxe")).data.startswith(b"#!ipxe")
            assert (await fetch(addr, "nothing")).error is not None
            await tftp_plugin._services[node].server.wait_idle()
            assert seen.seen == [("vmlinuz", "127.0.0.1"), ("hello.ipxe", "127.0.0.1")]
            assert node.status()["tftp"]["transfers"]["complete"] == 2  # the bug changed nothing
            node.request_stop("test")


def test_development_defaults(tmp_path):
    config, pm = configured(tmp_path, tftp=tftp_plugin)
    node = Node(config, pm)
    cfg = server_config(node)
    assert cfg.addresses == (ipaddress.IPv4Address("127.0.0.1"),) and cfg.port == 6969
    assert cfg.root == tmp_path / "data" / "tftp" / "root"
    assert (cfg.max_blksize, cfg.max_windowsize, cfg.retries) == (65464, 64, 5)


def test_production_defaults_and_cross_key_check(tmp_path):
    from appliance.config import validate
    from appliance.pluginmanager import collect_sections

    _, pm = configured(tmp_path, tftp=tftp_plugin)
    config = validate("<test>", {}, collect_sections(pm), dev=False)
    tftp = config["tftp"]
    assert (tftp.port, tftp.root, tuple(map(str, tftp.addresses))) == (
        69, "/srv/rackboot/tftp", ("0.0.0.0",)
    )  # fmt: skip
    with pytest.raises(ConfigError, match="tftp.max_timeout"):
        configured(tmp_path, {"tftp": {"timeout": 4.0, "max_timeout": 2.0}}, tftp=tftp_plugin)


async def test_the_node_serves_its_root_and_the_hook_and_reports(tmp_path):
    config, pm = configured(tmp_path, {"tftp": {"port": 0}}, tftp=tftp_plugin, dyn=Dynamic())
    node = Node(config, pm)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: node.run(handle_signals=False, task_status=task_status)
            )
            root = tmp_path / "data" / "tftp" / "root"
            assert root.is_dir()  # created at start
            assert (tmp_path / "data" / "tftp").stat().st_mode & 0o777 == 0o700
            (root / "pxelinux.0").write_bytes(b"\x90" * 3000)
            status = node.status()["tftp"]
            host, port = status["listening"][0].split(":")
            addr = (host, int(port))
            assert (await fetch(addr, "/pxelinux.0", {"blksize": "1468"})).data == b"\x90" * 3000
            assert (await fetch(addr, "hello.ipxe")).data == b"#!ipxe\necho 127.0.0.1\n"
            assert (await fetch(addr, "nothing")).error == (1, "nothing: file not found")
            service = tftp_plugin._services[node]
            await service.server.wait_idle()
            status = node.status()["tftp"]
            assert status["transfers"]["complete"] == 2 and status["transfers"]["refused"] == 1
            assert status["errors_sent"] == {"1": 1} and status["bytes_sent"] == 3000 + 22
            text = prometheus_client.generate_latest(node.metrics).decode()
            assert 'rackboot_tftp_transfers_total{outcome="complete"} 2.0' in text
            assert 'rackboot_tftp_errors_sent_total{code="1"} 1.0' in text
            assert "rackboot_tftp_bytes_total 3022.0" in text
            node.request_stop("test")


async def test_node_stop_ends_transfers_in_flight_and_joins_the_pump(tmp_path):
    import threading

    from plugins.tftp.packets import Opcode, encode_request

    # Long retransmission timeouts: nothing ends by itself while the node stops.
    document = {"tftp": {"port": 0, "timeout": 30.0, "max_timeout": 30.0}}
    config, pm = configured(tmp_path, document, tftp=tftp_plugin)
    node = Node(config, pm)
    root = tmp_path / "data" / "tftp" / "root"
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: node.run(handle_signals=False, task_status=task_status)
            )
            (root / "big.bin").write_bytes(bytes(200_000))
            host, port = node.status()["tftp"]["listening"][0].split(":")
            socks = []
            for _ in range(3):  # each takes DATA 1 and never acknowledges it
                sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
                await sock.bind(("127.0.0.1", 0))
                await sock.sendto(encode_request(Opcode.RRQ, "big.bin"), (host, int(port)))
                await sock.recvfrom(2048)
                socks.append(sock)
            assert node.status()["tftp"]["active_transfers"] == 3
            node.request_stop("test")
    # node.run returned: the pump thread is gone and every transfer was released.
    assert not any(t.name == "tftp-pump" for t in threading.enumerate())
    assert tftp_plugin._services[node].stats.active == 0
    for sock in socks:
        sock.close()
