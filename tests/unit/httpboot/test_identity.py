"""Machine identity in URLs and the events token."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from plugins.httpboot.identity import (
    bearer_untrusted,
    machine_token,
    parse_mac_untrusted,
    token_matches,
    url_mac,
)

SECRET = b"s" * 32


@pytest.mark.parametrize(
    ("text", "mac"),
    [
        ("52-54-00-12-34-56", "52:54:00:12:34:56"),
        ("52:54:00:12:34:56", "52:54:00:12:34:56"),
        ("AA-BB-CC-DD-EE-FF", "aa:bb:cc:dd:ee:ff"),
        ("52-54:00-12-34-56", None),  # mixed separators
        ("52540012345 6", None),
        ("525400123456", None),
        ("52-54-00-12-34-5g", None),
        ("52-54-00-12-34-56-78", None),
        ("", None),
    ],
)
def test_mac_forms(text, mac):
    assert parse_mac_untrusted(text) == mac


def test_url_form_is_dhcps_mac_placeholder():
    assert url_mac("52:54:00:12:34:56") == "52-54-00-12-34-56"


def test_token_is_per_machine_per_boot_and_per_secret():
    token = machine_token(SECRET, "52:54:00:12:34:56", "n1")
    assert len(token) == 32 and int(token, 16) >= 0
    assert token == machine_token(SECRET, "52:54:00:12:34:56", "n1")
    assert token != machine_token(SECRET, "52:54:00:12:34:57", "n1")
    assert token != machine_token(SECRET, "52:54:00:12:34:56", "n2")  # the next boot
    assert token != machine_token(b"t" * 32, "52:54:00:12:34:56", "n1")
    # a boundary between MAC and nonce: no other pair makes the same message
    assert machine_token(SECRET, "52:54:00:12:34:5", "6n1") != token


def test_the_token_is_the_hmac_every_release_computes():
    """A standby of another release must accept the active's tokens: HMAC-SHA256 of the
    context, the MAC and the nonce, its first 32 hex digits."""
    message = b"rackboot events v2\0" + b"52:54:00:12:34:56\0n1"
    expected = hmac.new(SECRET, message, hashlib.sha256).hexdigest()[:32]
    assert machine_token(SECRET, "52:54:00:12:34:56", "n1") == expected
    assert (
        machine_token(b"t" * 32, "52:54:00:12:34:56", "n1")
        == (hmac.new(b"t" * 32, message, hashlib.sha256).hexdigest()[:32])
    )


@pytest.mark.parametrize(
    ("header", "credentials"),
    [
        (b"Bearer abc123", b"abc123"),
        (b"bearer  abc123 ", b"abc123"),
        (b"Bearer a.b-c_d~e+f/g==", b"a.b-c_d~e+f/g=="),
        (b"Basic abc123", None),
        (b"Bearer", None),
        (b"Bearer ", None),
        (b"Bearer abc def", None),
        (b"Bearer \xff", None),
        (b"Bearer " + b"a" * 600, None),
        (None, None),
    ],
)
def test_bearer(header, credentials):
    assert bearer_untrusted(header) == credentials


def test_token_matches():
    assert token_matches("abc", b"abc")
    assert not token_matches("abc", b"abd")
    assert not token_matches("abc", None)
    assert not token_matches("", b"")  # a disabled token never matches
