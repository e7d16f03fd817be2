"""A machine's ``power`` address (docs/power.md): ``SCHEME:REST``, the scheme naming the
power plugin that reaches it (``redfish://BMC/redfish/v1/Systems/ID``, ``qemu:NAME``).

Shared by the power plugins so that each reads the scheme the same way (case-insensitive,
as in URLs) and answers only for its own."""

from __future__ import annotations


def split_address(power: str) -> tuple[str, str]:
    """``(scheme, rest)`` of a power address, the scheme in lower case; ``("", "")`` for a
    machine with no address or one without a scheme."""
    scheme, colon, rest = power.partition(":")
    if not colon or not scheme:
        return "", ""
    return scheme.lower(), rest
