"""`rackboot doctor` as an operator runs it, against a real node on loopback (the
``rackboot_node`` fixture): the real CLI in a subprocess, its report and exit code."""

from __future__ import annotations

import json
import subprocess
import sys

from appliance.errors import EXIT_CONFIG, EXIT_DOCTOR_FAIL, EXIT_UNREACHABLE

WARN_OR_OK = (0, 6)  # time.clock warns on a machine without NTP


def doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appliance", "doctor", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_healthy_dev_node_passes_every_check_it_can(rackboot_node):
    node = rackboot_node(plugins=["dhcp", "tftp", "httpboot", "images"])
    socket = str(node.node.control_path)
    res = doctor("--socket", socket, "--dev", "--json")
    report = json.loads(res.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert res.returncode in WARN_OR_OK, res.stdout + res.stderr
    assert report["exit_code"] == res.returncode and report["socket"] == socket
    for name in ("node", "services", "ports", "ha.lease", "state.log", "dhcp.pools", "images"):
        assert checks[name]["verdict"] == "pass", checks[name]
    # ports: the node's DHCP socket, found in the kernel's table among the node's own
    [dhcp] = checks["ports"]["data"]["listeners"]
    assert dhcp["key"] == "dhcp.port" and dhcp["port"] == node.config["dhcp"].port
    assert checks["time.clock"]["verdict"] in ("pass", "warn")
    for name in ("time.skew", "cluster.links", "ha.peers", "ha.witnesses", "state.replication"):
        assert checks[name]["verdict"] == "skip", checks[name]  # a standalone node
    # the text report: a line per finding, a summary last; the same exit code
    text = doctor("--socket", socket, "--dev")
    lines = text.stdout.splitlines()
    assert text.returncode == res.returncode and lines[0].startswith("PASS  node ")
    assert lines[-1].endswith(f"{report['counts']['skip']} skipped")


def test_no_node_exits_4_and_still_reports_what_it_can(tmp_path):
    res = doctor("--socket", str(tmp_path / "none.sock"), "--dev")
    assert res.returncode == EXIT_UNREACHABLE
    lines = res.stdout.splitlines()
    assert lines[0].startswith("FAIL  node ") and "no node answers" in lines[0]
    assert any(line.startswith(("PASS  time.clock", "WARN  time.clock")) for line in lines)
    assert "SKIP  services           no node answers" in lines


def test_a_probe_without_the_dhcp_plugin_fails_and_bad_options_exit_2(tmp_path):
    sock = str(tmp_path / "none.sock")
    res = doctor("--socket", sock, "--dev", "--disable-plugin", "dhcp", "--dhcp-probe", "eth9")
    assert "FAIL  dhcp-probe" in res.stdout and "no loaded plugin runs it" in res.stdout
    res = doctor("--socket", sock, "--dev", "--dhcp-probe", "nosuchif0", "--json")
    probe = {c["check"]: c for c in json.loads(res.stdout)["checks"]}["dhcp.probe"]
    assert probe["verdict"] == "fail" and "no probe on nosuchif0" in probe["summary"]
    for bad in (("--timeout", "0"), ("--timeout", "61"), ("--known-server", "dhcp.example")):
        res = doctor("--socket", sock, "--dev", *bad)
        assert res.returncode == EXIT_CONFIG and res.stderr.startswith("rackboot: error: --")
    assert doctor("--socket", sock, "--dev", "--timeout", "x").returncode == EXIT_CONFIG


SCAPY_PROBE = """
import sys
from appliance.cli import main
code = main(sys.argv[1:])
print("SCAPY", "scapy" in sys.modules, code)
"""


def test_scapy_is_imported_only_for_the_probe(tmp_path):
    sock = str(tmp_path / "none.sock")
    out = subprocess.run([sys.executable, "-c", SCAPY_PROBE, "doctor", "--socket", sock, "--dev"],
                         capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    assert out.splitlines()[-1] == f"SCAPY False {EXIT_UNREACHABLE}"
    out = subprocess.run([sys.executable, "-c", SCAPY_PROBE, "doctor", "--socket", sock, "--dev",
                          "--dhcp-probe", "lo", "--timeout", "0.2"],
                         capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    assert out.splitlines()[-1] == f"SCAPY True {EXIT_UNREACHABLE}"
    assert EXIT_DOCTOR_FAIL == 7
