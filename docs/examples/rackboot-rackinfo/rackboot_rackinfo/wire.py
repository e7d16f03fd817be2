"""What rackinfo puts on the wire, as pure functions (no I/O, no clock): easy to test.

* DHCP option 125, V-I Vendor-Specific Information (RFC 3925): our enterprise
  number, then sub-options: 1 the rack's location, 2 the machine's install state.
* The TFTP file ``rackinfo/MAC.txt``: the same facts as ``key=value`` lines.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from typing import Any

VIVSO = 125  # RFC 3925
SUB_LOCATION = 1
SUB_STATE = 2
MAX_DATA = 255  # one enterprise's data-len is one octet
MAX_NAME = 64  # a file name longer than this is no name of ours
# rackinfo/52-54-00-12-34-56.txt (MACs in URLs and file names use dashes, as iPXE's ${mac:hexhyp})
FILE_NAME = re.compile(r"rackinfo/((?:[0-9a-f]{2}-){5}[0-9a-f]{2})\.txt")


def encode_vivso(enterprise: int, suboptions: Mapping[int, bytes]) -> bytes:
    """Option 125's value: enterprise number, data length, then code/length/value each."""
    data = b"".join(bytes([code, len(value)]) + value for code, value in suboptions.items())
    if len(data) > MAX_DATA or any(len(v) > 255 for v in suboptions.values()):
        raise ValueError(f"vendor data of {len(data)} bytes: at most {MAX_DATA}")
    return struct.pack("!IB", enterprise, len(data)) + data


def decode_vivso_untrusted(value: bytes) -> dict[int, dict[int, bytes]]:
    """Option 125 from a reply: enterprise -> {sub-option code: value}. ValueError on
    anything malformed (a length running past the end)."""
    out: dict[int, dict[int, bytes]] = {}
    at = 0
    while at < len(value):
        if at + 5 > len(value):
            raise ValueError("truncated enterprise header")
        enterprise, size = struct.unpack_from("!IB", value, at)
        data, at = value[at + 5 : at + 5 + size], at + 5 + size
        if len(data) != size:
            raise ValueError("enterprise data runs past the option")
        subs, n = out.setdefault(enterprise, {}), 0
        while n < len(data):
            if n + 2 > len(data) or n + 2 + data[n + 1] > len(data):
                raise ValueError("sub-option runs past its enterprise data")
            subs[data[n]] = data[n + 2 : n + 2 + data[n + 1]]
            n += 2 + data[n + 1]
    return out


def mac_of_file_untrusted(path: str) -> str | None:
    """``aa:bb:cc:dd:ee:ff`` for ``rackinfo/aa-bb-cc-dd-ee-ff.txt`` (any case), else None:
    a TFTP name is whatever a client sent, so only an exact match is ours."""
    if len(path) > MAX_NAME:
        return None
    match = FILE_NAME.fullmatch(path.lower())
    return match[1].replace("-", ":") if match else None


def state_text(record: Mapping[str, Any] | None) -> str:
    """A machine's install state in one word: ``new`` before any event, else STAGE:STATUS."""
    if not record:
        return "new"
    return f"{record['stage']}:{record['status']}"


def render_file(location: str, mac: str, record: Mapping[str, Any] | None) -> bytes:
    lines = [f"location={location}", f"machine={mac}", f"state={state_text(record)}"]
    return ("\n".join(lines) + "\n").encode()
