"""IPv6 neighbour discovery from a lab host, crafted and read with scapy (the oracle).

    python -m tests.support.ndp_probe solicit IFNAME SECONDS
    python -m tests.support.ndp_probe router IFNAME SECONDS

``solicit``: waits (at most 10 s) until IFNAME's link-local address has passed DAD
(a unicast answer to it needs the host to answer neighbour solicitations), starts
capturing, sends one router solicitation to ff02::2 from that address (hop limit
255, our link-layer address), then prints one JSON object per router advertisement
heard in SECONDS: addresses, hop limit, router lifetime, M/O flags, options.

``router``: a router that advertises a default route and a prefix: prints ``ready``,
then sends an RA (router lifetime 1800, prefix 2001:db8:1::/64) to ff02::1 every
0.3 s for SECONDS. Both end by themselves.
"""

from __future__ import annotations

import json
import sys
import time
from ipaddress import IPv6Address
from pathlib import Path

from scapy.all import AsyncSniffer, Ether, get_if_hwaddr, sendp
from scapy.layers.inet6 import (
    ICMPv6ND_RA,
    ICMPv6ND_RS,
    ICMPv6NDOptPrefixInfo,
    ICMPv6NDOptSrcLLAddr,
    IPv6,
)

DAD_WAIT = 10.0
TENTATIVE = 0x40


def link_local(ifname: str) -> str | None:
    """IFNAME's link-local address once DAD is done (read apart from the code under test)."""
    for line in Path("/proc/net/if_inet6").read_text().splitlines():
        hexaddr, _, _, scope, flags, name = line.split()
        if name == ifname and scope == "20" and not int(flags, 16) & TENTATIVE:
            return str(IPv6Address(bytes.fromhex(hexaddr)))  # compressed, as scapy writes it
    return None


def wait_link_local(ifname: str) -> str:
    deadline = time.monotonic() + DAD_WAIT
    while (address := link_local(ifname)) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"{ifname}: no link-local address within {DAD_WAIT} s")
        time.sleep(0.1)
    return address


def describe(packet) -> dict:
    ra = packet[ICMPv6ND_RA]
    options = []
    layer = ra.payload
    while layer and layer.name != "NoPayload":
        options.append(layer.name)
        layer = layer.payload
    lladdr = packet[ICMPv6NDOptSrcLLAddr].lladdr if packet.haslayer(ICMPv6NDOptSrcLLAddr) else None
    return {"t": float(packet.time), "src": packet[IPv6].src, "dst": packet[IPv6].dst,
            "eth_dst": packet[Ether].dst, "hlim": packet[IPv6].hlim, "lifetime": ra.routerlifetime,
            "M": ra.M, "O": ra.O, "options": options, "lladdr": lladdr}  # fmt: skip


def solicit(ifname: str, seconds: float) -> None:
    address, mac = wait_link_local(ifname), get_if_hwaddr(ifname)
    sniffer = AsyncSniffer(iface=ifname, store=True, lfilter=lambda p: ICMPv6ND_RA in p)
    sniffer.start()
    time.sleep(0.3)  # the capture socket is open before the question leaves
    print(json.dumps({"ready": True, "address": address, "mac": mac}), flush=True)
    sendp(Ether(src=mac, dst="33:33:00:00:00:02")
          / IPv6(src=address, dst="ff02::2", hlim=255)
          / ICMPv6ND_RS() / ICMPv6NDOptSrcLLAddr(lladdr=mac), iface=ifname, verbose=False)  # fmt: skip
    time.sleep(seconds)
    for packet in sniffer.stop():
        print(json.dumps(describe(packet)), flush=True)


def router(ifname: str, seconds: float) -> None:
    address, mac = wait_link_local(ifname), get_if_hwaddr(ifname)
    advertisement = (Ether(src=mac, dst="33:33:00:00:00:01")
                     / IPv6(src=address, dst="ff02::1", hlim=255)
                     / ICMPv6ND_RA(routerlifetime=1800) / ICMPv6NDOptSrcLLAddr(lladdr=mac)
                     / ICMPv6NDOptPrefixInfo(prefix="2001:db8:1::", prefixlen=64))  # fmt: skip
    print(json.dumps({"ready": True, "address": address}), flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # bounded: SECONDS / 0.3 advertisements
        sendp(advertisement, iface=ifname, verbose=False)
        time.sleep(0.3)


if __name__ == "__main__":
    {"solicit": solicit, "router": router}[sys.argv[1]](sys.argv[2], float(sys.argv[3]))
