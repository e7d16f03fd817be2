"""Cluster identities made offline (appliance/lab/identities.py) and free port pairs
for HA tests."""

from __future__ import annotations

import random
import socket

from appliance.lab.identities import enrol_members, node_id  # noqa: F401 (tests use them)

_EPHEMERAL_BELOW = (20000, 32768)  # Linux's ephemeral ports start at 32768 by default


def free_udp_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """UDP ports free now whose TCP port one up is free too (replication listens there),
    below the ephemeral range: an outgoing connection of the test itself (a peer link,
    a replication client) is never given one of them, so a node restarted on its old
    ports finds them free. Another process could still take one: tests retry nothing."""
    low, high = _EPHEMERAL_BELOW
    rng = random.Random()
    found: list[int] = []
    for _ in range(1000):
        port = rng.randrange(low, high - 1)
        if port in found or port + 1 in found or port - 1 in found:
            continue
        if _free(host, port, socket.SOCK_DGRAM) and _free(host, port + 1, socket.SOCK_STREAM):
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError(f"no {count} free port pairs between {low} and {high}")


def _free(host: str, port: int, kind: int) -> bool:
    with socket.socket(socket.AF_INET, kind) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
