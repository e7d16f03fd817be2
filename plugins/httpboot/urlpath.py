"""Request targets to decoded paths (sans-IO): the HTTP half of path confinement.

The decoded path then goes through the same confinement as TFTP
(appliance/confine.py). Here, every way of smuggling a separator or a parent
directory through URL encoding is refused before any file is looked at:

* ``%2f`` (an encoded ``/``), ``%5c`` and ``\\`` (backslashes), and any ``..``
  segment, raw or encoded (``%2e%2e``): :class:`Forbidden` (403);
* ``%00`` or any other control character, a malformed ``%`` escape, a target
  that is not origin-form or absolute-form: :class:`BadTarget` (400);
* what still looks encoded after one decoding (``%252e`` -> ``%2e``): a
  double-encoded target is :class:`Forbidden`, so no later decoding by anyone
  can turn it into something else.

Byte values above 0x7f are decoded as file names are (``os.fsdecode``).
"""

from __future__ import annotations

import os
import re

MAX_TARGET = 4096
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
_LOOKS_ENCODED = re.compile(r"%[0-9A-Fa-f]{2}")
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


class BadTarget(Exception):
    """The target is not a valid request target: 400."""

    status = 400


class Forbidden(BadTarget):
    """The target tries to leave the tree it names: 403."""

    status = 403


def split_target_untrusted(target: bytes) -> tuple[str, bytes]:
    """``(decoded path, raw query)`` of a request target, or :class:`BadTarget`."""
    if len(target) > MAX_TARGET:
        raise BadTarget("target too long")
    if target[:7].lower() == b"http://" or target[:8].lower() == b"https://":
        # absolute-form (RFC 9112 3.2.2): the authority is not ours to check, the path is
        after_scheme = target.index(b"//") + 2
        slash = target.find(b"/", after_scheme)
        target = target[slash:] if slash >= 0 else b"/"
    if not target.startswith(b"/"):
        raise BadTarget("not origin-form")
    target = target.partition(b"#")[0]
    raw_path, _, query = target.partition(b"?")
    if raw_path.count(b"%") != len(_ESCAPE.findall(raw_path)):
        raise BadTarget("malformed percent-encoding")
    decoded = (
        _ESCAPE.sub(lambda m: _unescape(m.group(1)), raw_path) if b"%" in raw_path else raw_path
    )
    if _CONTROL.search(decoded):
        raise BadTarget("control character")
    if b"\\" in decoded:
        raise Forbidden("backslash")
    if decoded.count(b"/") != raw_path.count(b"/"):
        raise Forbidden("encoded slash")
    path = os.fsdecode(decoded)
    if ".." in path.split("/"):
        raise Forbidden("parent segment")
    if _LOOKS_ENCODED.search(path):
        raise Forbidden("double encoding")
    return path, query


class SplitTargets:
    """:func:`split_target_untrusted` of recent targets (the same few names are asked over
    and over); a target's answer never changes. Bounded: ``size`` targets of at most
    ``longest`` bytes, all forgotten when full."""

    def __init__(self, size: int = 4096, longest: int = 256) -> None:
        self.size, self.longest = size, longest
        self.known: dict[bytes, tuple[str, bytes] | BadTarget] = {}

    def __call__(self, target: bytes) -> tuple[str, bytes]:
        known = self.known.get(target)
        if known is None:
            try:
                known = split_target_untrusted(target)
            except BadTarget as exc:
                known = exc
            if len(target) <= self.longest:
                if len(self.known) >= self.size:
                    self.known.clear()
                self.known[target] = known
        if isinstance(known, BadTarget):
            raise type(known)(*known.args)
        return known


def _unescape(hex_digits: bytes) -> bytes:
    return bytes((int(hex_digits, 16),))


MAX_QUERY = 512
MAX_PARAMETERS = 8
_PARAMETER = re.compile(rb"[A-Za-z0-9_.~:-]*")  # unreserved, and ':' for a MAC


def parse_query_untrusted(query: bytes, known: tuple[str, ...]) -> dict[str, str]:
    """``name=value&...`` of an API route's query, every name among ``known``, each once,
    names and values of unreserved characters only (a MAC, a number); else
    :class:`BadTarget`. What an API needs is never percent-encoded, so nothing is."""
    if len(query) > MAX_QUERY:
        raise BadTarget("query too long")
    parameters: dict[str, str] = {}
    for pair in query.split(b"&") if query else ():
        name, has_value, value = pair.partition(b"=")
        if not (has_value and _PARAMETER.fullmatch(name) and _PARAMETER.fullmatch(value)):
            raise BadTarget("query: expected name=value pairs of letters, digits, - . _ ~ :")
        text = name.decode("ascii")
        if text not in known:
            raise BadTarget(f"query: unknown parameter {text[:32]!r} (known: {', '.join(known)})")
        if text in parameters or len(parameters) >= MAX_PARAMETERS:
            raise BadTarget(f"query: {text!r} given twice")
        parameters[text] = value.decode("ascii")
    return parameters
