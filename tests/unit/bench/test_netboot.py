"""bench/netboot/timings.py: access logs, DHCP frames and consoles to stage times, medians,
the ratio table and the scale summary, on recorded lines (no VM, no namespace)."""

from __future__ import annotations

from calendar import timegm

import pytest

from bench.netboot import timings
from bench.netboot.boots import mac_of
from bench.netboot.timings import BootRecord

MAC = "52:54:00:6e:00:00"
OTHER = "52:54:00:6e:00:01"
RACKBOOT_LOG = """\
ts=2026-11-25T17:23:03.700Z level=info logger=rackboot.node msg=ready node=netboot-node
ts=2026-11-25T17:23:03.873Z level=info logger=rackboot.httpboot.access msg=request client=10.1.2.100 method=GET target=/boot/52-54-00-6e-00-00.ipxe status=200 bytes=317 ms=2.7
ts=2026-11-25T17:23:04.268Z level=info logger=rackboot.httpboot.access msg=request client=10.1.2.100 method=GET target=/boot/vmlinuz?x=1 status=200 bytes=14149568 ms=381.6
ts=2026-11-25T17:23:04.300Z level=info logger=rackboot.httpboot.access msg=request client=10.1.2.101 method=GET target=/boot/vmlinuz status=200 bytes=14149568 ms=300.0
"""
NGINX_LOG = """\
1795627393.072 10.1.2.114 GET /boot/52-54-00-6e-00-01.ipxe 200 328 0.000
1795627393.466 10.1.2.114 GET /boot/vmlinuz 200 14149568 0.355
1795627399.402 10.1.2.114 POST /api/v1/machines/52-54-00-6e-00-01/events 201 12 0.001
not a log line
"""


def bootp(mac: str, kind: int, xid: int = 7, yiaddr: str = "0.0.0.0") -> str:
    """A minimal BOOTP payload with option 53 = ``kind``, as the sniffer records it (hex)."""
    data = bytearray(240)
    data[0] = 2 if kind in (2, 5, 6) else 1
    data[4:8] = xid.to_bytes(4, "big")
    data[16:20] = bytes(int(x) for x in yiaddr.split("."))
    data[28:34] = bytes.fromhex(mac.replace(":", ""))
    data[236:240] = b"\x63\x82\x53\x63"
    return (bytes(data) + bytes([53, 1, kind, 255])).hex()


def frame(t: float, mac: str, kind: int, xid: int = 7, yiaddr: str = "0.0.0.0") -> dict:
    server = kind in (2, 5, 6)
    return {"t": t, "sport": 67 if server else 68, "dport": 68 if server else 67,
            "payload": bootp(mac, kind, xid, yiaddr)}  # fmt: skip


def test_rackboot_access_lines_are_parsed_with_their_time_and_duration() -> None:
    lines = timings.rackboot_access(RACKBOOT_LOG)
    assert len(lines) == 3  # the node's other lines are not requests
    first = lines[0]
    assert first.t == pytest.approx(timegm((2026, 11, 25, 17, 23, 3, 0, 0, 0)) + 0.873)
    assert (first.client, first.method, first.path, first.status, first.ms) == (
        "10.1.2.100", "GET", "/boot/52-54-00-6e-00-00.ipxe", 200, 2.7)  # fmt: skip
    assert lines[1].path == "/boot/vmlinuz"  # the query string is not part of the path


def test_nginx_access_lines_use_msec_and_request_time_in_ms() -> None:
    lines = timings.nginx_access(NGINX_LOG)
    assert [a.method for a in lines] == ["GET", "GET", "POST"]
    assert lines[1].t == pytest.approx(1795627393.466)
    assert lines[1].ms == pytest.approx(355.0)
    assert lines[2].status == 201


def test_first_ack_and_addresses_of_one_mac_only() -> None:
    frames = [
        frame(10.0, MAC, 1), frame(10.001, MAC, 2, yiaddr="10.1.2.100"),
        frame(10.002, OTHER, 5, xid=9, yiaddr="10.1.2.101"),  # another VM's ACK
        frame(10.010, MAC, 3), frame(10.015, MAC, 5, yiaddr="10.1.2.100"),
        frame(20.0, MAC, 3, xid=8), frame(20.004, MAC, 5, xid=8, yiaddr="10.1.2.102"),
    ]  # fmt: skip
    assert timings.dhcp_acks(frames, MAC) == (10.015, {"10.1.2.100", "10.1.2.102"})
    assert timings.dhcp_acks(frames, "52:54:00:00:00:99") == (None, set())


def test_server_reply_time_sums_each_answer_after_the_latest_request_of_its_xid() -> None:
    frames = [
        frame(10.0, MAC, 1), frame(10.5, MAC, 1),  # a retransmitted DISCOVER: the later counts
        frame(10.502, MAC, 2), frame(10.6, MAC, 3), frame(10.61, MAC, 5),
        frame(30.0, MAC, 2, xid=99),  # an answer to nothing we saw asked: not counted
    ]  # fmt: skip
    assert timings.dhcp_reply_ms(frames, MAC) == pytest.approx(12.0)
    assert timings.dhcp_reply_ms([frame(1.0, MAC, 1)], MAC) is None


def test_stages_from_power_on_use_only_this_vms_addresses() -> None:
    access = timings.rackboot_access(RACKBOOT_LOG)
    t0 = access[0].t - 2.5  # power-on 2.5 s before the script was sent
    console = [
        (2.45, "Configuring (net0 52:54:00:6e:00:00)...... ok"),
        (7.9, "RACKBOOT-INSTALLER: init started, kernel 6.1.0"),
        (8.4, "RACKBOOT-INSTALLER: event posted to http://10.1.2.1/api/v1/machines/x/events: {}"),
    ]
    boot = BootRecord(MAC, t0, console, t0 + 2.4, {"10.1.2.100"}, access, 3.5)
    got = timings.stages(boot)
    assert got["dhcp"] == pytest.approx(2.4)
    assert got["configured"] == 2.45
    assert got["script"] == pytest.approx(2.5)
    assert got["kernel"] == pytest.approx(2.895)  # 10.1.2.101's later line is another VM's
    assert got["installed"] == 8.4
    assert got["event"] is None  # no POST in this log
    assert (got["dhcp_ms"], got["script_ms"], got["kernel_ms"]) == (3.5, 2.7, 381.6)
    assert timings.failure(boot) is None


def test_a_boot_without_the_marker_or_with_failed_is_a_failure() -> None:
    failed = BootRecord(MAC, 0.0, [(9.0, "RACKBOOT-INSTALLER: FAILED no DHCP lease")])
    assert timings.failure(failed) == "RACKBOOT-INSTALLER: FAILED no DHCP lease"
    silent = BootRecord(MAC, 0.0, [(60.0, "No bootable device.")])
    assert "no 'event posted'" in (timings.failure(silent) or "")
    assert timings.stages(silent)["installed"] is None


def test_medians_skip_missing_stages_and_ratio_says_slower() -> None:
    runs = [{"dhcp": 2.5, "installed": 8.0}, {"dhcp": 2.7, "installed": None},
            {"dhcp": 2.6, "installed": 9.0}]  # fmt: skip
    got = timings.medians(runs)
    assert (got["dhcp"], got["installed"], got["kernel"]) == (2.6, 8.5, None)
    assert timings.ratio(9.0, 10.0) == 0.9
    assert timings.ratio(1.0, 0.0) is None and timings.ratio(None, 1.0) is None
    table = timings.ratio_table("bios", {"dhcp": 2.0, "installed": 9.0},
                                {"dhcp": 2.5, "installed": 8.0})  # fmt: skip
    dhcp_row = next(line for line in table.splitlines() if "DHCPACK" in line)
    installed_row = next(line for line in table.splitlines() if "installed" in line)
    assert "0.80x" in dhcp_row and "slower" not in dhcp_row
    assert "1.12x" in installed_row and installed_row.endswith("slower")


def test_scale_summary_measures_from_the_first_power_on_to_the_last_installed() -> None:
    runs = [{"installed": 40.0, "event": 39.9}, {"installed": 41.0, "event": 40.9},
            {"installed": None, "event": None}]  # fmt: skip
    got = timings.scale_summary(runs, 100.0, [100.0, 100.5, 100.2])
    assert got == {"vms": 3, "installed": 2, "last_installed_s": 41.5, "last_event_s": 41.4,
                   "median_installed_s": 40.5, "power_on_spread_s": 0.5}  # fmt: skip


def test_every_boot_gets_its_own_mac() -> None:
    assert mac_of(0) == "52:54:00:6e:00:00"
    assert mac_of(0x1234) == "52:54:00:6e:12:34"
    with pytest.raises(ValueError):
        mac_of(1 << 16)
