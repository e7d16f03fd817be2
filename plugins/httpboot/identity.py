"""Who a machine is on the wire: its MAC in URLs, and the token its installer posts events with.

The token is an HMAC of the MAC under the node's secret: the boot script hands it
to the installer (kernel command line), nothing needs storing per machine, and a
machine's token is useless for any other MAC. Sans-IO.
"""

from __future__ import annotations

import hashlib
import hmac
import re

_MAC = re.compile(r"[0-9a-fA-F]{2}([-:])[0-9a-fA-F]{2}(?:\1[0-9a-fA-F]{2}){4}")
_TOKEN68 = re.compile(rb"[A-Za-z0-9._~+/-]+=*")
MAX_CREDENTIALS = 512  # an Authorization header longer than this is not ours
TOKEN_CONTEXT = b"rackboot events v1\0"
TOKEN_HEX_DIGITS = 32  # 128 bits: enough against guessing, short on a kernel command line


def parse_mac_untrusted(text: str) -> str | None:
    """``aa:bb:cc:dd:ee:ff`` (lower case) from ``aa-bb-..`` or ``AA:BB:..``, else ``None``."""
    if len(text) != 17 or not _MAC.fullmatch(text):
        return None
    return text.lower().replace("-", ":")


def url_mac(mac: str) -> str:
    """The MAC as it appears in URLs (and DHCP's ``{mac}``): ``aa-bb-cc-dd-ee-ff``."""
    return mac.replace(":", "-")


def machine_token(secret: bytes, mac: str) -> str:
    """The events token of ``mac`` (canonical form) under ``secret``."""
    digest = hmac.new(secret, TOKEN_CONTEXT + mac.encode("ascii"), hashlib.sha256).hexdigest()
    return digest[:TOKEN_HEX_DIGITS]


def bearer_untrusted(authorization: bytes | None) -> bytes | None:
    """The credentials of an ``Authorization: Bearer ...`` header (RFC 6750), else ``None``."""
    if not authorization or len(authorization) > MAX_CREDENTIALS:
        return None
    scheme, _, credentials = authorization.strip().partition(b" ")
    credentials = credentials.strip()
    if scheme.lower() != b"bearer" or not _TOKEN68.fullmatch(credentials):
        return None
    return credentials


def token_matches(expected: str, presented: bytes | None) -> bool:
    """Constant-time comparison; an empty ``expected`` (a disabled token) never matches."""
    if not expected or presented is None:
        return False
    return hmac.compare_digest(expected.encode("ascii"), presented)
