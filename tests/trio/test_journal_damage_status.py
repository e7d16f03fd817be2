"""A journal damaged in the middle, found when a node starts: the records around the
damage are served, and ``rackboot status`` says what happened (DHCP and HTTP boot)."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from appliance.journal import frame
from plugins.dhcp.leases import Lease, LeaseState, encode_lease
from plugins.httpboot.events import Event, encode_record
from tests.trio.test_dhcp_service import dhcp_document, free_udp_port, run_node
from tests.trio.test_httpboot_plugin import LIMIT, running, settings
from tests.unit.dhcp.clients import ip, mac


def plant_damaged(path: Path, payloads: list[bytes], damaged: int) -> None:
    """Write a journal of ``payloads`` whose record ``damaged`` has a flipped payload byte."""
    frames = [bytearray(frame(p)) for p in payloads]
    frames[damaged][-1] ^= 0xFF
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_bytes(b"".join(frames))


def check_damage(journal: dict, path: Path, kept: int, recovered: int) -> None:
    (damage,) = journal["damage"]
    assert damage["file"] == str(path) and damage["bytes_lost"] > 0
    assert (damage["records_kept"], damage["records_recovered"]) == (kept, recovered)
    assert Path(damage["copy"]).exists() and damage["when"].endswith("Z")


async def test_dhcp_status_reports_the_damage_and_serves_the_leases_around_it(tmp_path):
    path = tmp_path / "data" / "dhcp" / "leases.journal"
    now = time.time()
    leases = [
        Lease(
            ip(f"127.0.100.{10 + i}"),
            b"\x01" + mac(i),
            mac(i),
            "127.0.0.0/8",
            LeaseState.BOUND,
            now,
            now + 3600,
        )  # fmt: skip
        for i in range(3)
    ]
    plant_damaged(path, [encode_lease(lease) for lease in leases], damaged=1)
    port = free_udp_port()
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            node = await run_node(nursery, tmp_path, dhcp_document(port))
            status = node.status()["dhcp"]
            node.request_stop()
    check_damage(status["journal"], path, kept=2, recovered=1)
    assert status["pools"]["127.0.0.0/8"]["active"] == 2


async def test_httpboot_status_reports_the_damage_and_keeps_the_events_around_it(tmp_path):
    path = tmp_path / "data" / "httpboot" / "events.journal"
    mac = "52:54:00:12:34:56"
    events = [Event(mac, seq, 1.0e9 + seq, "install", "ok") for seq in (1, 2, 3)]
    plant_damaged(path, [encode_record(event) for event in events], damaged=1)
    with trio.fail_after(LIMIT):
        async with running(tmp_path, settings()) as (node, _):
            status = node.status()["httpboot"]
    check_damage(status["journal"], path, kept=2, recovered=1)
    assert status["machines_with_events"] == 1
