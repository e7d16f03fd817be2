"""The fields of the per-exchange DHCP log lines ([node] log_exchanges), sans-IO."""

from __future__ import annotations

import io
import logging
from ipaddress import IPv4Address

from appliance.logs import KeyValueFormatter, get_logger
from plugins.dhcp.codec import Message, build
from plugins.dhcp.exchangelog import received_fields_untrusted, sent_fields
from plugins.dhcp.options import MessageType, Opt

MAC = bytes.fromhex("525400120034")


def message(kind: MessageType, **fields) -> bytes:
    options = {Opt.MESSAGE_TYPE: bytes([kind]), **fields.pop("options", {})}
    return build(Message(chaddr=MAC, xid=0x1234ABCD, options=options, **fields))


def test_a_relayed_pxe_request() -> None:
    data = message(MessageType.REQUEST, giaddr=IPv4Address("10.1.2.1"), options={
        Opt.REQUESTED_IP: IPv4Address("10.1.2.50").packed,
        Opt.VENDOR_CLASS: b"PXEClient:Arch:00007", Opt.USER_CLASS: b"\x04iPXE",
        Opt.HOSTNAME: b"node7"})  # fmt: skip
    assert received_fields_untrusted(data, "vlan7", "10.1.2.1") == {
        "type": "REQUEST", "mac": "52:54:00:12:00:34", "xid": "1234abcd", "interface": "vlan7",
        "relay": "10.1.2.1", "from": "10.1.2.1", "requested": "10.1.2.50",
        "vendor_class": "PXEClient:Arch:00007", "user_class": "iPXE", "hostname": "node7",
    }  # fmt: skip


def test_a_reply_names_the_address_and_boot_file() -> None:
    data = message(MessageType.ACK, op=2, yiaddr=IPv4Address("10.1.2.50"),
                   siaddr=IPv4Address("10.1.2.5"), file=b"undionly.kpxe")  # fmt: skip
    fields = sent_fields(data, "eth1", "10.1.2.50:68")
    assert fields["type"] == "ACK" and fields["address"] == "10.1.2.50"
    assert (fields["boot"], fields["next_server"], fields["to"]) == (
        "undionly.kpxe", "10.1.2.5", "10.1.2.50:68")  # fmt: skip
    with_option = message(MessageType.OFFER, op=2, options={Opt.BOOTFILE_NAME: b"http://x/a.ipxe"})
    assert sent_fields(with_option, "eth1", "x")["boot"] == "http://x/a.ipxe"


def test_garbage_is_one_line_saying_so() -> None:
    assert received_fields_untrusted(b"\x01" * 20, "eth1", "0.0.0.0") == {
        "type": "malformed", "reason": "too-short", "interface": "eth1", "from": "0.0.0.0"}  # fmt: skip


def test_a_hostile_hostname_stays_on_its_line() -> None:
    """A client names itself with a newline and a fake field: the log line stays one line."""
    data = message(MessageType.DISCOVER, options={Opt.HOSTNAME: b'x\nmsg="forged" level=error'})
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(KeyValueFormatter())
    log = get_logger("dhcp-test")
    logging.getLogger("rackboot.dhcp-test").addHandler(handler)
    try:
        log.warning("dhcp received", **received_fields_untrusted(data, "eth1", "0.0.0.0"))
    finally:
        logging.getLogger("rackboot.dhcp-test").removeHandler(handler)
    text = stream.getvalue()
    assert text.count("\n") == 1 and 'msg="dhcp received"' in text
