"""The wire format alone: pure functions, no node."""

import pytest

from rackboot_rackinfo.wire import (
    decode_vivso_untrusted,
    encode_vivso,
    mac_of_file_untrusted,
    render_file,
)


def test_option_125_round_trips():
    value = encode_vivso(32473, {1: b"dc1/row4/rack7", 2: b"new"})
    assert value[:5] == bytes.fromhex("00007ed9") + bytes([2 + 14 + 2 + 3])
    assert decode_vivso_untrusted(value) == {32473: {1: b"dc1/row4/rack7", 2: b"new"}}


def test_option_125_refuses_what_does_not_fit():
    with pytest.raises(ValueError):
        encode_vivso(32473, {1: b"x" * 200, 2: b"y" * 60})


@pytest.mark.parametrize("cut", range(1, 12))
def test_a_truncated_option_is_refused(cut):
    value = encode_vivso(32473, {1: b"abc", 2: b"new"})
    with pytest.raises(ValueError):
        decode_vivso_untrusted(value[:-cut])


@pytest.mark.parametrize(
    ("path", "mac"),
    [
        ("rackinfo/52-54-00-12-34-56.txt", "52:54:00:12:34:56"),
        ("RACKINFO/52-54-00-AB-CD-EF.TXT", "52:54:00:ab:cd:ef"),
        ("rackinfo/../52-54-00-12-34-56.txt", None),
        ("rackinfo/52-54-00-12-34-56.txt/../../etc/passwd", None),
        ("rackinfo/52:54:00:12:34:56.txt", None),
        ("rackinfo/" + "5" * 100, None),
        ("pxelinux.0", None),
    ],
)
def test_only_exact_file_names_are_ours(path, mac):
    assert mac_of_file_untrusted(path) == mac


def test_the_file_says_location_machine_and_state():
    record = {"stage": "install", "status": "ok", "seq": 3, "time": 0.0}
    assert render_file("dc1", "52:54:00:12:34:56", record) == (
        b"location=dc1\nmachine=52:54:00:12:34:56\nstate=install:ok\n"
    )
    assert render_file("dc1", "52:54:00:12:34:56", None).endswith(b"state=new\n")
