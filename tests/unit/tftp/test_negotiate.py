"""Option negotiation: a table of requests and what the server acknowledges."""

from __future__ import annotations

import pytest

from plugins.tftp.negotiate import Options, blksize_for_mtu, negotiate

CASES = [
    # (requested, file_size, max_blksize, expected blksize/windowsize/timeout/tsize, oack)
    ({}, 100, 1468, (512, 1, None, None), {}),
    ({"blksize": "1024"}, 100, 1468, (1024, 1, None, None), {"blksize": "1024"}),
    ({"blksize": "8"}, 100, 1468, (8, 1, None, None), {"blksize": "8"}),
    ({"blksize": "9000"}, 100, 1468, (1468, 1, None, None), {"blksize": "1468"}),
    ({"blksize": "70000"}, 100, 65464, (65464, 1, None, None), {"blksize": "65464"}),
    ({"blksize": "7"}, 100, 1468, (512, 1, None, None), {}),  # below 8: ignored
    ({"blksize": "0"}, 100, 1468, (512, 1, None, None), {}),
    ({"blksize": "-1"}, 100, 1468, (512, 1, None, None), {}),
    ({"blksize": " 512"}, 100, 1468, (512, 1, None, None), {}),
    ({"blksize": "0x200"}, 100, 1468, (512, 1, None, None), {}),
    ({"blksize": ""}, 100, 1468, (512, 1, None, None), {}),
    ({"blksize": "9" * 30}, 100, 1468, (512, 1, None, None), {}),
    ({"tsize": "0"}, 1234, 1468, (512, 1, None, 1234), {"tsize": "1234"}),
    ({"tsize": "0"}, 0, 1468, (512, 1, None, 0), {"tsize": "0"}),
    ({"tsize": "77"}, 1234, 1468, (512, 1, None, 1234), {"tsize": "1234"}),
    ({"tsize": "0"}, None, 1468, (512, 1, None, None), {}),  # netascii / unknown size
    ({"tsize": "x"}, 1234, 1468, (512, 1, None, None), {}),
    ({"timeout": "5"}, 1, 1468, (512, 1, 5, None), {"timeout": "5"}),
    ({"timeout": "1"}, 1, 1468, (512, 1, 1, None), {"timeout": "1"}),
    ({"timeout": "255"}, 1, 1468, (512, 1, 255, None), {"timeout": "255"}),
    ({"timeout": "05"}, 1, 1468, (512, 1, 5, None), {"timeout": "5"}),
    ({"timeout": "0"}, 1, 1468, (512, 1, None, None), {}),
    ({"timeout": "256"}, 1, 1468, (512, 1, None, None), {}),
    ({"windowsize": "16"}, 1, 1468, (512, 16, None, None), {"windowsize": "16"}),
    ({"windowsize": "1"}, 1, 1468, (512, 1, None, None), {"windowsize": "1"}),
    ({"windowsize": "100"}, 1, 1468, (512, 64, None, None), {"windowsize": "64"}),
    ({"windowsize": "70000"}, 1, 1468, (512, 64, None, None), {"windowsize": "64"}),
    ({"windowsize": "0"}, 1, 1468, (512, 1, None, None), {}),
    ({"multicast": "", "utimeout": "1000"}, 1, 1468, (512, 1, None, None), {}),
    (
        {"windowsize": "8", "tsize": "0", "blksize": "1468", "rollover": "0"},
        10_000,
        1468,
        (1468, 8, None, 10_000),
        {"windowsize": "8", "tsize": "10000", "blksize": "1468"},
    ),
]


@pytest.mark.parametrize(("requested", "size", "max_blksize", "expected", "oack"), CASES)
def test_negotiation_table(requested, size, max_blksize, expected, oack):
    options = negotiate(requested, file_size=size, max_blksize=max_blksize)
    assert (options.blksize, options.windowsize, options.timeout, options.tsize) == expected
    assert options.oack == tuple(oack.items())  # request order is kept


def test_nothing_accepted_means_plain_rfc1350():
    assert negotiate({"blksize": "2"}, file_size=5, max_blksize=512) == Options()


def test_server_window_maximum():
    assert (
        negotiate(
            {"windowsize": "300"}, file_size=1, max_blksize=512, max_windowsize=256
        ).windowsize
        == 256
    )


@pytest.mark.parametrize("bad", [{"max_blksize": 7}, {"max_blksize": 65465}, {"max_windowsize": 0}])
def test_server_limits_are_checked(bad):
    with pytest.raises(ValueError):
        negotiate({}, file_size=1, **{"max_blksize": 512, **bad})


@pytest.mark.parametrize(
    ("mtu", "blksize"), [(1500, 1468), (9000, 8968), (576, 544), (20, 8), (70000, 65464)]
)
def test_blksize_for_mtu(mtu, blksize):
    assert blksize_for_mtu(mtu) == blksize
