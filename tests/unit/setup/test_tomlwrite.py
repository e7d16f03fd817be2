"""The TOML writer setup rewrites the configuration with: what tomllib reads back is what
was written, for the shapes a configuration has and for awkward strings and keys."""

from __future__ import annotations

import datetime
import math
import subprocess
import sys
import tomllib

import pytest

from appliance.setup.tomlwrite import dumps, value

AWKWARD = ['', 'quote " and \\ backslash', "tab\tnew\nline\r\f\b", "\x00\x1f\x7f", "é ☃ 𝄞",
           "'''", '"""', "# not a comment", "[not.a.table]"]  # fmt: skip


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"top": 1, "node": {"name": "a"}},
        {"s": AWKWARD, "k": {k or "empty": k for k in AWKWARD}},
        {"odd keys": {"a.b": 1, "": 2, "x y": {"z": 3}, "ü": 4}},
        {
            "n": {
                "i": -(2**63),
                "j": 2**63 - 1,
                "f": 0.1,
                "g": -1e300,
                "h": 1.5e-7,
                "z": -0.0,
                "inf": math.inf,
                "ninf": -math.inf,
                "t": True,
                "u": False,
            }
        },
        {
            "dhcp": {
                "interfaces": ["eth1"],
                "subnets": [
                    {
                        "network": "10.1.0.0/24",
                        "pools": [],
                        "boot": {"bios": "x", "deep": {"er": 1}},
                        "more": [{"a": 1}, {"b": [1, "two", [3.0]]}],
                    },
                    {"network": "10.2.0.0/24"},
                ],
                "empty": [],
                "after": {"x": 1},
            }
        },
        {"mixed": [1, {"a": 1}], "nested": [[{"a": [1]}], []], "inline": [{}]},
        {"a": {"b": {"c": {}}}, "d": {}},
        {
            "when": datetime.datetime(2026, 11, 25, 17, 1, 2, tzinfo=datetime.UTC),
            "day": datetime.date(2026, 11, 25),
            "at": datetime.time(8, 30),
        },
    ],
)
def test_round_trip(doc):
    assert tomllib.loads(dumps(doc, "header\nsecond line")) == doc


def test_nan_is_written_as_nan():
    assert math.isnan(tomllib.loads(dumps({"x": math.nan}))["x"])


def test_the_example_configuration_round_trips():
    example = subprocess.run([sys.executable, "-m", "appliance", "config", "example"],
                             capture_output=True, text=True, check=True, timeout=60).stdout  # fmt: skip
    doc = tomllib.loads(example)
    assert doc and tomllib.loads(dumps(doc)) == doc


def test_header_lines_are_comments_and_values_refuse_unknown_types():
    assert dumps({"a": 1}, "one\ntwo") == "# one\n# two\na = 1\n"
    with pytest.raises(TypeError):
        value(object())
