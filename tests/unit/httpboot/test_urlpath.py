"""Request targets: one decoding, and every encoded way out of the tree refused."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.httpboot.urlpath import (
    MAX_TARGET,
    BadTarget,
    Forbidden,
    SplitTargets,
    parse_query_untrusted,
    split_target_untrusted,
)

DECODED = [
    (b"/boot/vmlinuz", "/boot/vmlinuz", b""),
    (b"/boot/vmlinuz?x=1&y", "/boot/vmlinuz", b"x=1&y"),
    (b"/boot/a%20b", "/boot/a b", b""),
    (b"/boot/%41", "/boot/A", b""),
    (b"/boot/./vmlinuz", "/boot/./vmlinuz", b""),  # '.' is harmless: confinement resolves it
    (b"/boot/vmlinuz#frag", "/boot/vmlinuz", b""),
    (b"http://10.0.0.1:8080/boot/x?q", "/boot/x", b"q"),  # absolute-form
    (b"HTTP://host", "/", b""),
    (b"/boot/caf%E9", "/boot/" + os.fsdecode(b"caf\xe9"), b""),  # as file names decode
]

REFUSED = [
    (b"/boot/../etc/passwd", Forbidden),
    (b"/boot/..", Forbidden),
    (b"/..", Forbidden),
    (b"/boot/%2e%2e/secret", Forbidden),
    (b"/boot/%2E%2E/secret", Forbidden),
    (b"/boot/.%2e/secret", Forbidden),
    (b"/boot/..%2fsecret", Forbidden),  # encoded slash
    (b"/boot/%2fetc%2fpasswd", Forbidden),
    (b"/boot/%2Fetc", Forbidden),
    (b"/boot/..%5csecret", Forbidden),  # encoded backslash
    (b"/boot/..\\secret", Forbidden),
    (b"/boot/%252e%252e/secret", Forbidden),  # double encoding
    (b"/boot/%252fetc", Forbidden),
    (b"/boot/%25%32%65", Forbidden),  # %2e spelled with escapes: still looks encoded
    (b"/boot/x%00.efi", BadTarget),  # NUL
    (b"/boot/x%0a", BadTarget),
    (b"/boot/x%7f", BadTarget),
    (b"/boot/%zz", BadTarget),  # malformed escapes
    (b"/boot/%4", BadTarget),
    (b"/boot/%", BadTarget),
    (b"boot/x", BadTarget),  # not origin-form
    (b"*", BadTarget),
    (b"", BadTarget),
    (b"/" + b"a" * MAX_TARGET, BadTarget),
]


@pytest.mark.parametrize(("target", "path", "query"), DECODED)
def test_decoded_once(target, path, query):
    assert split_target_untrusted(target) == (path, query)


@pytest.mark.parametrize(("target", "kind"), REFUSED)
def test_refused(target, kind):
    with pytest.raises(BadTarget) as info:
        split_target_untrusted(target)
    assert type(info.value) is kind
    assert info.value.status == (403 if kind is Forbidden else 400)


def test_remembered_targets_answer_as_the_function_each_time():
    split = SplitTargets(size=4, longest=64)
    for _ in range(2):  # the second pass from memory (what fits)
        for target, path, query in DECODED:
            assert split(target) == (path, query)
        for target, kind in REFUSED:
            with pytest.raises(BadTarget) as info:
                split(target)
            assert type(info.value) is kind
    assert len(split.known) <= 4 and all(len(t) <= 64 for t in split.known)


@given(st.binary(max_size=200))
def test_never_yields_a_parent_segment_or_a_separator_it_did_not_see(raw):
    target = b"/" + raw
    try:
        path, _ = split_target_untrusted(target)
    except BadTarget:
        return
    assert ".." not in path.split("/")
    assert "\\" not in path and "\0" not in path
    assert path.count("/") == target.partition(b"?")[0].partition(b"#")[0].count(b"/")


# -- an API route's query ---------------------------------------------------------------

KNOWN = ("limit", "after")


@pytest.mark.parametrize(
    ("query", "parameters"),
    [
        (b"", {}),
        (b"limit=10", {"limit": "10"}),
        (b"limit=10&after=52:54:00:12:34:56", {"limit": "10", "after": "52:54:00:12:34:56"}),
        (b"after=52-54-00-12-34-56", {"after": "52-54-00-12-34-56"}),
        (b"limit=", {"limit": ""}),  # empty: the route says what it expects
    ],
)
def test_query_parameters(query, parameters):
    assert parse_query_untrusted(query, KNOWN) == parameters


@pytest.mark.parametrize(
    ("query", "rule"),
    [
        (b"limit=1&limit=2", "twice"),
        (b"offset=3", "unknown parameter 'offset'"),
        (b"limit", "name=value"),
        (b"limit=%31", "name=value"),  # nothing an API needs is encoded: nothing is decoded
        (b"limit=1&", "name=value"),
        (b"limit=a b", "name=value"),
        (b"limit=\xff", "name=value"),
        (b"a=" + b"1" * 600, "too long"),
    ],
)
def test_query_refusals(query, rule):
    with pytest.raises(BadTarget, match=rule):
        parse_query_untrusted(query, KNOWN)
