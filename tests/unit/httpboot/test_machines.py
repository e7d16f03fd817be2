"""A machine's boot record in the state log: what is read back, and what is refused."""

from __future__ import annotations

from dataclasses import fields

import pytest

from plugins.httpboot.machines import Boot, boot_from_state_untrusted

MAC = "52:54:00:12:34:56"
BOOT = Boot(MAC, "0123456789abcdef" * 2, "10.0.0.5", 1.7e9, 1.7e9 + 1, "a")


def test_a_boot_round_trips():
    assert boot_from_state_untrusted(MAC, BOOT.value()) == BOOT
    without_lease = Boot(MAC, BOOT.nonce, "10.0.0.5", None, 1.0)
    assert boot_from_state_untrusted(MAC, without_lease.value()) == without_lease


def test_the_record_holds_every_field_but_the_key():
    """value() is spelled out (asdict was slow): a field added to Boot must be added there."""
    assert set(BOOT.value()) == {field.name for field in fields(Boot)} - {"mac"}


@pytest.mark.parametrize(
    "change",
    [
        {"nonce": "short"},
        {"nonce": "G" * 32},
        {"nonce": None},
        {"address": "10.0.0.5\n"},
        {"address": 5},
        {"lease": "1.0"},
        {"lease": True},
        {"time": None},
        {"node": "n" * 65},
    ],
)
def test_a_malformed_boot_is_no_boot(change):
    assert boot_from_state_untrusted(MAC, {**BOOT.value(), **change}) is None


@pytest.mark.parametrize("value", [None, [], "x", 5])
def test_what_is_not_a_map_is_no_boot(value):
    assert boot_from_state_untrusted(MAC, value) is None
