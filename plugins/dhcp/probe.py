"""The rogue-DHCP probe of ``rackboot doctor --dhcp-probe IFACE`` (sans-IO).

A DISCOVER from a throw-away MAC (locally administered, random), broadcast flag
set so every server answers to the broadcast address; every answer naming our
transaction is collected (:class:`ProbeCollector`, bytes in through our own
codec's ``parse_untrusted``, malformed and unrelated frames counted and
dropped) and judged (:func:`judge_probe`): a server whose identifier is not one
of this rack's (the VIP, its appliances, ``--known-server``) is flagged.

Nothing is left behind: an OFFER reserves no lease here (Rackboot keeps offers
in memory only, as dnsmasq and Kea do), and the MAC is never seen again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address

from appliance.doctor.findings import Finding, count, failed, passed, warned

from .codec import BOOTREPLY, BROADCAST_FLAG, Message, build, parse_untrusted
from .options import MalformedPacket, MessageType, Opt

CHECK = "dhcp.probe"
VENDOR_CLASS = b"rackboot-doctor"
MAX_ANSWERS = 64  # distinct servers kept; past it, counted only
ANSWERS = {MessageType.OFFER: "OFFER", MessageType.ACK: "ACK", MessageType.NAK: "NAK"}
ASKED = bytes((Opt.SUBNET_MASK, Opt.ROUTER, Opt.DNS_SERVERS, Opt.LEASE_TIME, Opt.SERVER_ID,
               Opt.TFTP_SERVER_NAME, Opt.BOOTFILE_NAME))  # fmt: skip


def throwaway_mac(random6: bytes) -> bytes:
    """Six random bytes -> a locally administered unicast MAC (bit 1 set, bit 0 clear)."""
    if len(random6) != 6:
        raise ValueError("a MAC is 6 bytes")
    return bytes(((random6[0] | 0x02) & 0xFE,)) + random6[1:]


def discover(mac: bytes, xid: int, secs: int = 0) -> bytes:
    """The probe's DISCOVER: broadcast flag set, so every answer is broadcast."""
    message = Message(
        xid=xid, secs=secs, flags=BROADCAST_FLAG, chaddr=mac,
        options={
            Opt.MESSAGE_TYPE: bytes((MessageType.DISCOVER,)),
            Opt.CLIENT_ID: b"\x01" + mac,
            Opt.PARAMETER_REQUEST_LIST: ASKED,
            Opt.VENDOR_CLASS: VENDOR_CLASS,
        },
    )  # fmt: skip
    return build(message)


@dataclass(frozen=True)
class Answer:
    server_id: str  # option 54 ("" when the answer lacks it)
    source: str  # IP source of the datagram (a relay's address when relayed)
    source_mac: str
    kind: str  # OFFER | ACK | NAK
    offered: str  # yiaddr
    boot_file: str
    next_server: str  # siaddr
    after: float  # seconds after the first DISCOVER


class ProbeCollector:
    def __init__(self, mac: bytes, xid: int, started: float) -> None:
        self.mac, self.xid, self.started = mac, xid, started
        self.answers: list[Answer] = []
        self.malformed = self.unrelated = self.repeated = self.overflow = 0
        self._seen: set[tuple[str, str, str, str]] = set()

    def receive_untrusted(self, payload: bytes, source: str, source_mac: str, now: float) -> None:
        """One UDP payload that came to port 68, with where it came from."""
        try:
            msg = parse_untrusted(payload)
        except MalformedPacket:
            self.malformed += 1
            return
        kind = ANSWERS.get(msg.message_type)  # type: ignore[arg-type]
        if msg.op != BOOTREPLY or msg.xid != self.xid or msg.chaddr[:6] != self.mac or not kind:
            self.unrelated += 1
            return
        server_id = str(msg.server_id) if msg.server_id is not None else ""
        key = (server_id, source, source_mac, kind)
        if key in self._seen:
            self.repeated += 1  # the answer to our second DISCOVER
            return
        if len(self._seen) >= MAX_ANSWERS:
            self.overflow += 1
            return
        self._seen.add(key)
        boot = msg.options.get(Opt.BOOTFILE_NAME) or msg.file
        self.answers.append(Answer(
            server_id, source, source_mac, kind, str(msg.yiaddr),
            boot.decode("ascii", "replace")[:128], str(msg.siaddr), round(now - self.started, 3),
        ))  # fmt: skip

    def counts(self) -> dict[str, int]:
        return {"malformed": self.malformed, "unrelated": self.unrelated,
                "repeated": self.repeated, "overflow": self.overflow}  # fmt: skip


def _row(answer: Answer, known: Mapping[str, str]) -> str:
    who = known.get(answer.server_id)
    offered = f"offered {answer.offered}" if answer.kind != "NAK" else "NAK"
    boot = f", boot {answer.boot_file}" if answer.boot_file else ""
    return (
        f"{answer.server_id or '(no server id)':<15} from {answer.source} ({answer.source_mac}) "
        f"{offered}{boot} after {answer.after:.2f} s: {who or 'FOREIGN: not this rack'}"
    )


def judge_probe(
    interface: str,
    answers: Sequence[Answer],
    known: Mapping[str, str],
    *,
    timeout: float,
    serving_here: bool,
    counts: Mapping[str, int],
) -> Finding:
    """``known``: this rack's server identifiers -> what they are; ``serving_here``: the
    probe ran in the node's own namespace on an interface it serves (its own server does
    not hear a frame this host sends, so its silence is expected)."""
    details = tuple(_row(a, known) for a in answers)
    data = {"interface": interface, "answers": [a.__dict__ for a in answers],
            "known": dict(known), "counts": dict(counts)}  # fmt: skip
    foreign = [a for a in answers if a.server_id not in known]
    if foreign:
        names = ", ".join(f"{a.server_id or a.source} ({a.source_mac})" for a in foreign)
        return failed(
            CHECK, f"{count(len(answers), 'DHCP server')} answered on {interface}; not this rack's: {names}",
            "a foreign server hands out addresses (and boot files) of its own: machines that "
            "take its offer boot from it, or get no boot at all",
            "find it by its MAC (the switch's address table) and stop it; if it belongs, add "
            "--known-server ADDRESS", details=details, data=data,
        )  # fmt: skip
    if answers:
        servers = ", ".join(sorted({f"{a.server_id} ({known[a.server_id]})" for a in answers}))
        return passed(CHECK, f"only this rack's DHCP answered on {interface}: {servers}",
                      details=details, data=data)  # fmt: skip
    if serving_here:
        return passed(
            CHECK, f"no other DHCP server answered on {interface} within {timeout:g} s "
            "(this node's own server does not hear a probe sent from itself)", data=data,
        )  # fmt: skip
    return warned(
        CHECK, f"no DHCP server answered on {interface} within {timeout:g} s",
        "a machine on this link would get no address from this rack",
        "check the link reaches the appliances (VLAN, cabling, a relay) and [dhcp] "
        "interfaces; probe again with a longer --timeout", data=data,
    )  # fmt: skip


def known_address(text: str) -> str | None:
    """An address as option 54 would carry it ("192.0.2.1" from "192.0.2.1/24" or
    "host:port"), or None when it is not an IPv4 address."""
    host = text.split("/")[0].rpartition(":")[0] if ":" in text else text.split("/")[0]
    try:
        return str(IPv4Address(host))
    except ValueError:
        return None
