"""The rogue-DHCP probe's sans-IO part: the DISCOVER it sends (read back by scapy, the
oracle), the answers it keeps (offers crafted by scapy as another server would send
them), the verdict, and which servers count as this rack's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from appliance.doctor.findings import DoctorContext, DoctorOptions, Verdict
from plugins.dhcp.doctor import known_servers
from plugins.dhcp.probe import (
    MAX_ANSWERS,
    Answer,
    ProbeCollector,
    discover,
    judge_probe,
    known_address,
    throwaway_mac,
)

scapy_dhcp = pytest.importorskip("scapy.layers.dhcp", reason="scapy is the oracle (dev extra)")
BOOTP, DHCP = scapy_dhcp.BOOTP, scapy_dhcp.DHCP

MAC = throwaway_mac(bytes.fromhex("5f0102030405"))
XID = 0x1234ABCD


def offer(server: str | None, *, xid: int = XID, mac: bytes = MAC, kind: str = "offer",
          yiaddr: str = "10.0.0.120", op: int = 2) -> bytes:  # fmt: skip
    options = [("message-type", kind)] + ([("server_id", server)] if server else [])
    return bytes(BOOTP(op=op, xid=xid, chaddr=mac + bytes(10), yiaddr=yiaddr, file=b"pxelinux.0")
                 / DHCP(options=[*options, "end"]))  # fmt: skip


def test_a_throwaway_mac_is_locally_administered_unicast():
    for raw in (bytes(6), b"\xff" * 6, bytes.fromhex("5f0102030405")):
        mac = throwaway_mac(raw)
        assert mac[0] & 0x02 and not mac[0] & 0x01 and mac[1:] == raw[1:]
    with pytest.raises(ValueError):
        throwaway_mac(b"\x00" * 5)


def test_the_discover_as_scapy_reads_it():
    packet = BOOTP(discover(MAC, XID, secs=1))
    assert (packet.op, packet.xid, packet.secs, packet.flags) == (1, XID, 1, 0x8000)
    assert packet.chaddr[:6] == MAC
    options = dict(o for o in packet[DHCP].options if isinstance(o, tuple))
    assert options["message-type"] == 1 and options["client_id"] == b"\x01" + MAC
    assert options["vendor_class_id"] == b"rackboot-doctor"
    assert 54 in options["param_req_list"] and 67 in options["param_req_list"]


def test_answers_to_our_transaction_are_kept_once_each():
    probe = ProbeCollector(MAC, XID, started=100.0)
    probe.receive_untrusted(offer("10.0.0.1"), "10.0.0.1", "02:00:00:00:00:01", 100.25)
    probe.receive_untrusted(offer("10.0.0.1"), "10.0.0.1", "02:00:00:00:00:01", 101.2)  # again
    probe.receive_untrusted(offer("10.0.0.9", kind="nak"), "10.0.0.9", "02:00:00:00:00:09", 100.5)
    assert probe.answers == [
        Answer("10.0.0.1", "10.0.0.1", "02:00:00:00:00:01", "OFFER", "10.0.0.120",
               "pxelinux.0", "0.0.0.0", 0.25),
        Answer("10.0.0.9", "10.0.0.9", "02:00:00:00:00:09", "NAK", "10.0.0.120",
               "pxelinux.0", "0.0.0.0", 0.5),
    ]  # fmt: skip
    assert probe.counts() == {"malformed": 0, "unrelated": 0, "repeated": 1, "overflow": 0}


def test_other_transactions_requests_and_garbage_are_counted_and_dropped():
    probe = ProbeCollector(MAC, XID, started=0.0)
    for payload in (offer("10.0.0.1", xid=XID + 1), offer("10.0.0.1", mac=b"\x02" * 6),
                    offer("10.0.0.1", op=1), offer("10.0.0.1", kind="request"),
                    discover(MAC, XID)):  # fmt: skip
        probe.receive_untrusted(payload, "10.0.0.1", "02:00:00:00:00:01", 0.1)
    for junk in (b"", b"\x02" * 100, offer("10.0.0.1")[:-20] + b"\x35\x09"):
        probe.receive_untrusted(junk, "10.0.0.1", "02:00:00:00:00:01", 0.1)
    assert probe.answers == []
    assert probe.counts()["unrelated"] == 5 and probe.counts()["malformed"] == 3


def test_a_flood_of_servers_is_bounded():
    probe = ProbeCollector(MAC, XID, started=0.0)
    for n in range(MAX_ANSWERS + 10):
        server = f"10.1.{n // 250}.{n % 250 + 1}"
        probe.receive_untrusted(offer(server), server, "02:00:00:00:00:01", 0.1)
    assert len(probe.answers) == MAX_ANSWERS and probe.counts()["overflow"] == 10


def answer(server_id: str, mac: str = "02:00:00:00:00:01") -> Answer:
    return Answer(server_id, server_id, mac, "OFFER", "10.0.0.120", "", "0.0.0.0", 0.1)


def judge(answers, known, serving_here=False):
    return judge_probe("eth1", answers, known, timeout=3.0, serving_here=serving_here,
                       counts={})  # fmt: skip


KNOWN = {"10.0.0.200": "this rack's VIP"}


def test_a_foreign_server_fails_naming_its_address_and_mac():
    finding = judge([answer("10.0.0.200"), answer("10.0.0.66", "52:54:00:aa:bb:cc")], KNOWN)
    assert finding.verdict is Verdict.FAIL
    assert "not this rack's: 10.0.0.66 (52:54:00:aa:bb:cc)" in finding.summary
    assert "10.0.0.200" not in finding.summary and "--known-server" in finding.action
    rows = {row.split()[0]: row for row in finding.details}
    assert rows["10.0.0.66"].endswith("FOREIGN: not this rack")
    assert rows["10.0.0.200"].endswith("this rack's VIP")
    # an answer without a server identifier is nobody's we know
    assert judge([answer("")], KNOWN).verdict is Verdict.FAIL


def test_only_the_rack_passes_and_silence_depends_on_where_the_probe_ran():
    assert judge([answer("10.0.0.200")], KNOWN).verdict is Verdict.PASS
    assert judge([], KNOWN, serving_here=True).verdict is Verdict.PASS
    silent = judge([], KNOWN)
    assert silent.verdict is Verdict.WARN and "--timeout" in silent.action


def test_known_addresses_from_every_spelling():
    assert known_address("10.0.0.200/24") == "10.0.0.200"
    assert known_address("10.0.0.2:7471") == "10.0.0.2"
    assert known_address("10.0.0.2") == "10.0.0.2"
    assert known_address("appliance.example:7470") is None and known_address("::1") is None


def test_this_racks_servers_come_from_config_status_and_the_command_line():
    config = {
        "ha": SimpleNamespace(vip="10.0.0.200/24", peers=["B1@10.0.0.2:7471"]),
        "dhcp": SimpleNamespace(server_address=None),
    }
    status = {
        "core": {"rack": "r1", "cluster": {"site": [
            {"name": "c", "rack": "r1", "address": "10.0.0.4:7470"},
            {"name": "x", "rack": "r9", "address": "10.9.0.4:7470"},  # another rack's
        ]}},
        "dhcp": {"server_identifiers": ["10.0.0.1", "10.0.0.200"]},
    }  # fmt: skip
    ctx = DoctorContext(config, DoctorOptions(known_servers=("10.0.0.77",)), 0.0, status)
    assert known_servers(ctx) == {
        "10.0.0.200": "this rack's VIP", "10.0.0.2": "appliance B1",
        "10.0.0.1": "this rack's appliance", "10.0.0.4": "appliance c",
        "10.0.0.77": "--known-server",
    }  # fmt: skip
