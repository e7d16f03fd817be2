"""Are the node's declared listeners bound, by the node? (sans-IO)

The facts come from the kernel's socket tables of the node's network namespace
(``/proc/PID/net/{udp,tcp,udp6,tcp6}``, parsed by :func:`parse_table_untrusted`)
and the socket inodes the node's process holds (``/proc/PID/fd``); the shell
reads them (:mod:`appliance.doctor.observe`). Each listener the configuration
declares (``status.core.listeners``) must be bound by the node itself: bound
by nobody, a service is not serving; bound also by another program on the
same port (``SO_BINDTODEVICE``, ``SO_REUSEPORT``), that program may answer
instead of the node.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from appliance.doctor.findings import Finding, count, failed, passed, skipped, warned

CHECK = "ports"
MAX_TABLE_LINES = 100_000  # a namespace with more sockets than this is read in part
TCP_LISTEN = "0A"
WILDCARDS = ("0.0.0.0", "::")


@dataclass(frozen=True)
class Bound:
    protocol: str  # "udp" | "tcp"
    address: str  # "0.0.0.0", "127.0.0.1", "::"
    port: int
    inode: int


def _address(text: str) -> str | None:
    """/proc prints each 32-bit word of the address in the host's byte order."""
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    if len(raw) not in (4, 16):
        return None
    words = b"".join(raw[i : i + 4][:: -1 if sys.byteorder == "little" else 1]
                     for i in range(0, len(raw), 4))  # fmt: skip
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def parse_table_untrusted(text: str, protocol: str) -> list[Bound]:
    """A /proc/net/{udp,tcp}[6] table -> its bound sockets (TCP: listening ones only).
    Lines that do not parse are skipped."""
    found = []
    for line in text.splitlines()[1 : MAX_TABLE_LINES + 1]:
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1]:
            continue
        host, _, port = fields[1].rpartition(":")
        if protocol == "tcp" and fields[3] != TCP_LISTEN:
            continue
        address = _address(host)
        if address is None or not port.isalnum() or not fields[9].isdigit():
            continue
        try:
            found.append(Bound(protocol, address, int(port, 16), int(fields[9])))
        except ValueError:
            continue
    return found


def _covers(bound: Bound, listener: Mapping[str, Any]) -> bool:
    return (
        bound.protocol == listener.get("protocol")
        and bound.port == listener.get("port")
        and (bound.address == listener.get("address") or bound.address in WILDCARDS)
    )


def _name(listener: Mapping[str, Any]) -> str:
    return f"{listener.get('protocol')} {listener.get('address')}:{listener.get('port')} ({listener.get('key')})"


def judge_ports(
    listeners: Sequence[Mapping[str, Any]],
    sockets: Iterable[Bound] | None,
    node_inodes: frozenset[int],
    others: Mapping[int, str] | None = None,
    why_unseen: str = "",
) -> Finding:
    """``sockets``: the namespace's bound sockets (None: unreadable, ``why_unseen``);
    ``node_inodes``: the node's own; ``others``: inode -> the program holding it."""
    if not listeners:
        return skipped(CHECK, "the configuration declares no listener")
    if sockets is None:
        return warned(
            CHECK, "cannot see the node's sockets", why_unseen,
            "run the doctor as root (or the node's user) on the appliance itself",
        )  # fmt: skip
    sockets = list(sockets)
    unbound, shared, lines = [], [], []
    for listener in listeners:
        covering = [s for s in sockets if _covers(s, listener)]
        ours = [s for s in covering if s.inode in node_inodes]
        theirs = [s for s in covering if s.inode not in node_inodes]
        if not ours:
            unbound.append(_name(listener))
        for s in theirs:
            who = (others or {}).get(s.inode, "another program")
            shared.append(f"{_name(listener)}: {who} also bound {s.address}:{s.port}")
        lines.append(f"{_name(listener)}: {'bound by the node' if ours else 'NOT BOUND'}")
    data = {"listeners": list(listeners), "unbound": unbound, "shared": shared}
    if unbound:
        return failed(
            CHECK, f"{len(unbound)} of {count(len(listeners), 'declared listener')} not bound by the node: "
            + ", ".join(unbound),
            "a service that does not hold its socket does not serve",
            "see `rackboot status` for the service's state and the node's log for its error; "
            "restart the node",
            details=tuple(lines + shared), data=data,
        )  # fmt: skip
    if shared:
        return warned(
            CHECK, "another program listens on a port of the node: " + "; ".join(shared),
            "it may answer instead of the node (a second DHCP or TFTP server on the appliance)",
            "stop that program, or move one of the two to another port or address",
            details=tuple(lines), data=data,
        )  # fmt: skip
    return passed(
        CHECK, f"{count(len(listeners), 'declared listener')} bound by the node", details=tuple(lines),
        data=data,
    )  # fmt: skip
