"""The roll's updater on an appliance's A/B slots (appliance/firmware), on a plain-file
"disk" as tests/unit/firmware lays it out: what the roll sees through the slots'
update, boot on trial and rollback."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from appliance.firmware.bundle import make_bundle
from appliance.rolling.updater import Firmware, NoUpdater, SlotUpdater, UpdateError
from tests.unit.firmware.test_install import Box


def test_the_slots_seen_through_an_update_a_failed_trial_and_the_rollback(tmp_path):
    box = Box(tmp_path)
    updater = SlotUpdater(box.firmware)
    assert updater.firmware() == Firmware("1.0", updater="slots")
    bundle = box.bundle("1.1")
    assert updater.check(bundle) == "1.1"
    updater.install(bundle)
    updater.restart()
    assert box.reboots == [["systemctl", "reboot"]]
    entries = box.esp / "loader/entries"
    os.rename(entries / "rackboot-3-b+3-0.conf", entries / "rackboot-3-b+2-1.conf")  # booted
    box.boot_into("b")
    assert updater.firmware() == Firmware("1.1", trial=True, updater="slots")
    assert box.firmware.judge(False)  # `rackboot firmware health`: unhealthy, back to A
    box.boot_into("a")
    seen = updater.firmware()
    assert (seen.version, seen.trial, seen.failed) == ("1.0", False, "1.1")
    assert "failed its health check" in seen.why


def test_a_bundle_the_slots_refuse_is_an_update_error_naming_why(tmp_path):
    box = Box(tmp_path)
    stranger = tmp_path / "stranger.bundle"
    stranger.write_bytes(make_bundle({"rootfs": b"r" * 100}, version="1.1", board="x86_64",
                                     key=Ed25519PrivateKey.generate(), created=1.7e9))  # fmt: skip
    with pytest.raises(UpdateError, match="not a trusted release key|signer"):
        SlotUpdater(box.firmware).check(stranger)
    with pytest.raises(UpdateError, match="older|downgrade"):
        SlotUpdater(box.firmware).check(box.bundle("0.9"))


def test_an_appliance_without_slots_takes_part_in_no_roll(tmp_path):
    updater = NoUpdater("no EFI system partition at /boot/efi ([firmware] esp)")
    assert updater.firmware().version == ""
    with pytest.raises(UpdateError, match="cannot install firmware: no EFI system partition"):
        updater.check(tmp_path / "x.bundle")
