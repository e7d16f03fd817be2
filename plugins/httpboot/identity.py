"""Who a machine is on the wire: its MAC in URLs, and the token its installer posts events with.

The token is an HMAC of the MAC and of its current boot's nonce under the rack's
secret: the boot script hands it to the installer (kernel command line), it is
useless for any other MAC, and it dies with the machine's next boot (a new nonce,
recorded in the state log: plugins/httpboot/boots.py). Sans-IO.
"""

from __future__ import annotations

import functools
import hmac
import re

_MAC = re.compile(r"[0-9a-fA-F]{2}([-:])[0-9a-fA-F]{2}(?:\1[0-9a-fA-F]{2}){4}")
_TOKEN68 = re.compile(rb"[A-Za-z0-9._~+/-]+=*")
MAX_CREDENTIALS = 512  # an Authorization header longer than this is not ours
# v1 was the MAC alone: a token for ever, which anyone could fetch with the MAC's script.
TOKEN_CONTEXT = b"rackboot events v2\0"
TOKEN_HEX_DIGITS = 32  # 128 bits: enough against guessing, short on a kernel command line


def parse_mac_untrusted(text: str) -> str | None:
    """``aa:bb:cc:dd:ee:ff`` (lower case) from ``aa-bb-..`` or ``AA:BB:..``, else ``None``."""
    if len(text) != 17 or not _MAC.fullmatch(text):
        return None
    return text.lower().replace("-", ":")


def url_mac(mac: str) -> str:
    """The MAC as it appears in URLs (and DHCP's ``{mac}``): ``aa-bb-cc-dd-ee-ff``."""
    return mac.replace(":", "-")


def machine_token(secret: bytes, mac: str, nonce: str) -> str:
    """The events token of ``mac`` (canonical form) for its boot ``nonce`` under ``secret``."""
    keyed = _keyed(secret).copy()  # the key's pads hashed once, not per token
    keyed.update(TOKEN_CONTEXT + mac.encode("ascii") + b"\0" + nonce.encode("ascii"))
    return keyed.hexdigest()[:TOKEN_HEX_DIGITS]


@functools.lru_cache(maxsize=4)
def _keyed(secret: bytes) -> hmac.HMAC:
    return hmac.new(secret, digestmod="sha256")


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
