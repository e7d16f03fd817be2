"""The plugin in a real node (in-process, loopback, no root), through Rackboot's own
protocol plugins and the client drivers of its pytest plugin ``rackboot``."""

import json
import os
import subprocess
import sys

import pytest

from rackboot_rackinfo.wire import decode_vivso_untrusted

MAC = "52:54:00:12:34:56"
PLUGINS = ["dhcp", "tftp", "httpboot", "rackinfo"]
CONFIG = {
    "rackinfo": {"location": "dc1/row4/rack7"},
    # A machine's script and events only from the address its DHCP lease gave it.
    "httpboot": {"bind_tokens_to_lease": True},
}


@pytest.fixture
def node(rackboot_node):
    return rackboot_node(plugins=PLUGINS, config=CONFIG)


def vendor_info(ack):
    return decode_vivso_untrusted(ack.options[125])[32473]


def install(node, status="ok"):
    """A machine's boot as far as its installer's event: DHCP, script, event."""
    ack = node.dhcp.dora(MAC)
    boot = node.http.script(MAC, source=str(ack.yiaddr))
    reply = node.http.event(boot, "install", status)
    assert reply.status == 201, reply
    return node.wait_for(lambda s: s["rackinfo"]["recorded"] >= 1, what="the event recorded")


def test_the_vendor_option_goes_to_clients_that_ask_for_it(node):
    ack = node.dhcp.dora(MAC, params=[1, 3, 125])
    assert vendor_info(ack) == {1: b"dc1/row4/rack7", 2: b"new"}
    assert 125 not in node.dhcp.dora("52:54:00:00:00:02", params=[1, 3]).options


def test_an_installer_event_is_recorded_and_told_everywhere(node):
    install(node)
    # In the replicated state, committed ...
    record = node.call(node.node.state.get, "rackinfo.machines", MAC)
    assert (record["stage"], record["status"]) == ("install", "ok")
    # ... and told by DHCP, TFTP and HTTP alike.
    assert vendor_info(node.dhcp.dora(MAC, params=[125]))[2] == b"install:ok"
    text = node.tftp.get("rackinfo/52-54-00-12-34-56.txt")
    assert text == b"location=dc1/row4/rack7\nmachine=52:54:00:12:34:56\nstate=install:ok\n"
    mine = node.http.get("/api/v1/rackinfo/52-54-00-12-34-56")
    assert mine.status == 200 and mine.json()["status"] == "ok"
    assert node.http.get("/api/v1/rackinfo/52-54-00-00-00-09").status == 404
    assert list(node.http.get("/api/v1/rackinfo").json()["machines"]) == [MAC]
    assert node.status()["rackinfo"] == {
        "location": "dc1/row4/rack7",
        "machines": 1,
        "recorded": 1,
        "dropped": 0,
        "refused": 0,
    }


def test_the_state_outlives_a_restart(rackboot_node):
    node = rackboot_node(plugins=PLUGINS, config=CONFIG)
    install(node, status="failed")
    node.stop()
    again = rackboot_node(plugins=PLUGINS, config=CONFIG)  # the same data directory
    assert again.tftp.get("rackinfo/52-54-00-12-34-56.txt").endswith(b"state=install:failed\n")


def test_tftp_names_that_are_not_ours_go_to_the_root(node):
    # Not ours: the root answers, and refuses to leave itself (2: access violation).
    assert node.tftp.error("rackinfo/../../etc/passwd")[0] == 2
    assert node.tftp.error("rackinfo/52-54-00-12-34-56.txt.bak")[0] == 1  # not found
    (node.data_dir / "tftp" / "root" / "pxelinux.0").write_bytes(b"\x90" * 700)
    assert node.tftp.get("pxelinux.0") == b"\x90" * 700


def test_the_cli_command_asks_the_running_node(node):
    install(node)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, "-m", "appliance", "rackinfo", "machines",
            "--socket", node.node.control_path]  # fmt: skip
    shown = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == f"{MAC}  install:ok  seq 1\n"
    as_json = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert json.loads(as_json.stdout)[MAC]["stage"] == "install"
