"""Which declared listeners the node holds: the /proc tables parsed, the verdict judged."""

from __future__ import annotations

import sys

import pytest

from appliance.doctor.findings import Verdict
from appliance.doctor.sockets import Bound, judge_ports, parse_table_untrusted

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def row(local: str, state: str, inode: int) -> str:
    return f"   0: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 2 0\n"


@pytest.mark.skipif(sys.byteorder != "little", reason="the sample rows are a little-endian host's")
def test_proc_tables_parse_addresses_ports_and_inodes():
    udp = HEADER + row("0100007F:1B39", "07", 11) + row("00000000:0043", "07", 12)
    assert parse_table_untrusted(udp, "udp") == [
        Bound("udp", "127.0.0.1", 6969, 11),
        Bound("udp", "0.0.0.0", 67, 12),
    ]
    # TCP: listening sockets only (0A); an established one is no listener
    tcp = HEADER + row("0100007F:1F90", "0A", 13) + row("0100007F:1F90", "01", 14)
    assert parse_table_untrusted(tcp, "tcp") == [Bound("tcp", "127.0.0.1", 8080, 13)]
    # IPv6: the wildcard, and an IPv4-mapped address read as IPv4
    tcp6 = (
        HEADER
        + row("00000000000000000000000000000000:0050", "0A", 15)
        + row("0000000000000000FFFF00000100007F:0051", "0A", 16)
    )
    assert parse_table_untrusted(tcp6, "tcp") == [
        Bound("tcp", "::", 80, 15),
        Bound("tcp", "127.0.0.1", 81, 16),
    ]


def test_garbage_lines_are_skipped_never_raised():
    text = HEADER + "nonsense\n" + row("ZZ00007F:1B39", "07", 1) + row("0100007F:XYZ!", "07", 2)
    text += row("0100007F:1B39", "07", 0).replace(" 0 2 0", " x 2 0") + row("01:1B39", "07", 3)
    assert parse_table_untrusted(text, "udp") == []
    assert parse_table_untrusted("", "udp") == []


TFTP = {"protocol": "udp", "address": "127.0.0.1", "port": 6969, "key": "tftp.port"}
DHCP = {"protocol": "udp", "address": "0.0.0.0", "port": 67, "key": "dhcp.port"}


def test_every_listener_bound_by_the_node_passes():
    sockets = [Bound("udp", "127.0.0.1", 6969, 1), Bound("udp", "0.0.0.0", 67, 2)]
    finding = judge_ports([TFTP, DHCP], sockets, frozenset({1, 2}))
    assert finding.verdict is Verdict.PASS and finding.summary.startswith("2 declared")


def test_a_wildcard_socket_covers_a_specific_address():
    finding = judge_ports([TFTP], [Bound("udp", "0.0.0.0", 6969, 1)], frozenset({1}))
    assert finding.verdict is Verdict.PASS


def test_an_unbound_listener_fails_naming_it():
    sockets = [Bound("udp", "0.0.0.0", 67, 2), Bound("tcp", "127.0.0.1", 6969, 9)]
    finding = judge_ports([TFTP, DHCP], sockets, frozenset({2, 9}))  # TCP is not UDP
    assert finding.verdict is Verdict.FAIL
    assert "udp 127.0.0.1:6969 (tftp.port)" in finding.summary and "dhcp" not in finding.summary
    assert finding.reason and finding.action


def test_a_port_held_only_by_another_program_fails_and_one_shared_warns():
    sockets = [Bound("udp", "0.0.0.0", 67, 7)]
    finding = judge_ports([DHCP], sockets, frozenset({1}), {7: "dnsmasq (pid 812)"})
    assert finding.verdict is Verdict.FAIL and "dnsmasq (pid 812) also bound" in finding.details[-1]
    sockets.append(Bound("udp", "0.0.0.0", 67, 1))
    finding = judge_ports([DHCP], sockets, frozenset({1}), {7: "dnsmasq (pid 812)"})
    assert finding.verdict is Verdict.WARN and "dnsmasq (pid 812)" in finding.summary


def test_unseen_sockets_warn_and_no_listener_skips():
    finding = judge_ports([TFTP], None, frozenset(), why_unseen="/proc/42/fd: Permission denied")
    assert finding.verdict is Verdict.WARN and finding.reason == "/proc/42/fd: Permission denied"
    assert judge_ports([], [], frozenset()).verdict is Verdict.SKIP
