"""Option negotiation for read requests: RFC 2347 (OACK), 2348, 2349, 7440.

RFC 2347 lets a server refuse a request whose options it dislikes; we never do.
An option with an invalid value (not a decimal number, or out of range where the
RFC gives no room to clamp) is left out of the OACK, as is an unknown option, and
the transfer runs with that option's default: a client that sent a wrong value
still gets its file, which is what a PXE ROM needs. When nothing is acknowledged
no OACK is sent and the transfer starts plainly with DATA 1 (RFC 1350).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .packets import MAX_BLKSIZE

MIN_BLKSIZE = 8
DEFAULT_BLKSIZE = 512
MAX_WINDOWSIZE = 65535  # RFC 7440; above it 16-bit ACKs could not name a block in the window
DEFAULT_MAX_WINDOWSIZE = 64  # server default: bounds per-transfer memory (window cache)


@dataclass(frozen=True, slots=True)
class Options:
    """What a transfer runs with; ``oack`` is what to acknowledge (empty: send no OACK)."""

    blksize: int = DEFAULT_BLKSIZE
    windowsize: int = 1
    timeout: int | None = None  # seconds (RFC 2349); None: the server's own default
    tsize: int | None = None
    oack: tuple[tuple[str, str], ...] = ()


def blksize_for_mtu(mtu: int) -> int:
    """The largest blksize whose DATA fits one IPv4 datagram: MTU - IP 20 - UDP 8 - TFTP 4."""
    return max(MIN_BLKSIZE, min(MAX_BLKSIZE, mtu - 32))


def _number(value: str) -> int | None:
    # ASCII digits only; the length cap keeps int() cheap (values are < 2**64).
    if not (value.isascii() and value.isdigit()) or len(value) > 20:
        return None
    return int(value)


def negotiate(
    requested: Mapping[str, str],
    *,
    file_size: int | None,
    max_blksize: int,
    max_windowsize: int = DEFAULT_MAX_WINDOWSIZE,
) -> Options:
    """Answer a read request's options (names already lower-cased by the codec).

    ``file_size`` is None when the size sent is not known in advance (netascii,
    which expands line ends; dynamic content): ``tsize`` is then not acknowledged.
    ``max_blksize`` comes from the interface MTU (:func:`blksize_for_mtu`).
    """
    if not MIN_BLKSIZE <= max_blksize <= MAX_BLKSIZE:
        raise ValueError(f"max_blksize must lie in {MIN_BLKSIZE}..{MAX_BLKSIZE}")
    if not 1 <= max_windowsize <= MAX_WINDOWSIZE:
        raise ValueError(f"max_windowsize must lie in 1..{MAX_WINDOWSIZE}")
    blksize, windowsize, timeout, tsize = DEFAULT_BLKSIZE, 1, None, None
    oack: list[tuple[str, str]] = []
    for name, raw in requested.items():
        value = _number(raw)
        if value is None:
            continue
        if name == "blksize" and value >= MIN_BLKSIZE:
            # Larger than 65464 is out of range, but answering smaller is allowed: clamp.
            blksize = min(value, max_blksize)
            oack.append((name, str(blksize)))
        elif name == "windowsize" and value >= 1:
            windowsize = min(value, max_windowsize)
            oack.append((name, str(windowsize)))
        elif name == "timeout" and 1 <= value <= 255:
            timeout = value  # RFC 2349: acknowledged unchanged or not at all
            oack.append((name, str(value)))
        elif name == "tsize" and file_size is not None:
            # A client's RRQ says 0; a non-zero value is tolerated and answered alike.
            tsize = file_size
            oack.append((name, str(file_size)))
    return Options(blksize, windowsize, timeout, tsize, tuple(oack))
