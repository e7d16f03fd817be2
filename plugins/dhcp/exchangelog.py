"""The fields of one log line per DHCP message received and sent, for an operator
watching a rack boot (the ``[node] log_exchanges`` switch, like dnsmasq's
``--log-dhcp``). Sans-IO: bytes in, fields out; called only while the switch is on,
so the second parse costs nothing otherwise."""

from __future__ import annotations

from ipaddress import IPv4Address

from .codec import MalformedPacket, Message, parse_untrusted
from .options import Opt, decode_str

_ZERO = IPv4Address(0)


def received_fields_untrusted(data: bytes, interface: str, source: str) -> dict[str, object]:
    """What a request says: its type, the client, what it asks for and through whom."""
    try:
        msg = parse_untrusted(data)
    except MalformedPacket as exc:
        return {"type": "malformed", "reason": exc.reason, "interface": interface, "from": source}
    fields = _common(msg, interface)
    fields["from"] = source
    if msg.requested_ip is not None:
        fields["requested"] = str(msg.requested_ip)
    if msg.ciaddr != _ZERO:
        fields["ciaddr"] = str(msg.ciaddr)
    if msg.vendor_class:
        fields["vendor_class"] = decode_str(msg.vendor_class)
    if msg.user_classes:
        fields["user_class"] = ",".join(decode_str(c) for c in msg.user_classes)
    if msg.client_arches:
        fields["arch"] = ",".join(str(a) for a in msg.client_arches)
    if msg.hostname:
        fields["hostname"] = msg.hostname
    return fields


def sent_fields(payload: bytes, interface: str, destination: str) -> dict[str, object]:
    """What a reply of ours gives: the address, the boot file, where it went."""
    msg = parse_untrusted(payload)  # built by the server: well-formed
    fields = _common(msg, interface)
    if msg.yiaddr != _ZERO:
        fields["address"] = str(msg.yiaddr)
    boot = msg.options.get(Opt.BOOTFILE_NAME) or msg.file
    if boot:
        fields["boot"] = decode_str(boot)
    if msg.siaddr != _ZERO:
        fields["next_server"] = str(msg.siaddr)
    fields["to"] = destination
    return fields


def _common(msg: Message, interface: str) -> dict[str, object]:
    kind = msg.message_type
    fields: dict[str, object] = {
        "type": kind.name if kind is not None else "BOOTP",
        "mac": msg.mac or msg.chaddr[: min(msg.hlen, 16)].hex(":"),
        "xid": f"{msg.xid:08x}",
        "interface": interface,
    }
    if msg.giaddr != _ZERO:
        fields["relay"] = str(msg.giaddr)
    return fields
