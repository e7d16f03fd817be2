"""The rack's virtual IP (trio shell): netlink to add and remove it, gratuitous ARP to announce it.

:class:`VipKeeper` follows a wanted state the election sets synchronously
(:meth:`VipKeeper.want`): on ``True`` it adds the address (pyroute2), then
sends ``garp_count`` gratuitous ARPs spaced ``interval, 2*interval, ...``,
each only while the fence still says yes; on ``False`` it stops announcing
and removes the address. Netlink calls run in a worker thread: they take
milliseconds, and the trio thread keeps renewing meanwhile.

The address is added with a kernel lifetime of :data:`LIFETIME` seconds,
renewed every :data:`REFRESH` seconds while held: if the process dies
(``kill -9``) the kernel itself drops the VIP within seconds, instead of
answering ARP for it forever. The last gratuitous ARPs go out after that,
so neighbours end up pointing at the new holder.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct

import trio

from appliance.ha.fence import Fence
from appliance.logs import get_logger

log = get_logger("ha")

ETH_P_ARP = 0x0806
LIFETIME = 2  # seconds (the kernel's unit): a dead holder's VIP is gone this long after
REFRESH = 0.5
BROADCAST = b"\xff" * 6


def garp_frame(mac: bytes, address: str) -> bytes:
    """An ARP request for ``address`` from ``address`` (RFC 5227 announcement), broadcast."""
    ip = socket.inet_aton(address)
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, ip, b"\x00" * 6, ip)
    return BROADCAST + mac + struct.pack("!H", ETH_P_ARP) + arp


class Vip:
    """Blocking netlink and raw-socket operations on one interface."""

    def __init__(self, cidr: str, interface: str) -> None:
        iface = ipaddress.IPv4Interface(cidr)
        self.address = str(iface.ip)
        self.prefixlen = iface.network.prefixlen
        self.interface = interface

    def _index(self, ipr) -> int:
        found = ipr.link_lookup(ifname=self.interface)
        if not found:
            raise OSError(errno.ENODEV, f"no interface {self.interface!r} for the VIP")
        return found[0]

    def add(self) -> None:
        """Add, or refresh the lifetime of, the address."""
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        with IPRoute() as ipr:
            try:
                ipr.addr(
                    "replace", index=self._index(ipr), address=self.address,
                    prefixlen=self.prefixlen, valid_lft=LIFETIME, preferred_lft=LIFETIME,
                )  # fmt: skip
            except NetlinkError as exc:
                raise OSError(exc.code, f"cannot add VIP {self.address}: {exc}") from None

    def remove(self) -> None:
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        with IPRoute() as ipr:
            try:
                ipr.addr(
                    "del", index=self._index(ipr), address=self.address, prefixlen=self.prefixlen
                )
            except NetlinkError as exc:
                if exc.code not in (errno.EADDRNOTAVAIL, errno.ENOENT, errno.ESRCH):
                    raise OSError(exc.code, f"cannot remove VIP {self.address}: {exc}") from None

    def present(self) -> bool:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            index = self._index(ipr)
            return any(a.get_attr("IFA_ADDRESS") == self.address for a in ipr.get_addr(index=index))

    def announce(self) -> None:
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP)) as sock:
            sock.bind((self.interface, ETH_P_ARP))
            mac = sock.getsockname()[4][:6]
            sock.send(garp_frame(mac, self.address))


class VipKeeper:
    def __init__(self, vip: Vip, fence: Fence, *, count: int, interval: float) -> None:
        self.vip = vip
        self.fence = fence
        self.count = count
        self.interval = interval
        self.wanted = False
        self.held = False
        self.announced = 0
        self.errors = 0
        self._changed = trio.Event()

    def want(self, held: bool) -> None:
        if held != self.wanted:
            self.wanted = held
            self._changed.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # A VIP left behind by a crash of this node is not ours until the election says so.
        await self._apply(False)
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    self._changed = trio.Event()
                    was_held = self.held
                    await self._apply(self.wanted)
                    if self.held and not was_held:
                        nursery.start_soon(self._announce)
                    with trio.move_on_after(REFRESH if self.held else float("inf")):
                        await self._changed.wait()
                    if self.held and self.wanted and not self._changed.is_set():
                        await self._refresh()
        finally:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 2.0):
                await self._apply(False)

    async def _refresh(self) -> None:
        try:
            await trio.to_thread.run_sync(self.vip.add)
        except OSError as exc:
            self.errors += 1
            log.error("virtual IP refresh failed", vip=self.vip.address, error=str(exc))

    async def _apply(self, wanted: bool) -> None:
        try:
            if wanted and not self.held:
                await trio.to_thread.run_sync(self.vip.add)
                self.held = True
                log.info("took the virtual IP", vip=self.vip.address, interface=self.vip.interface)
            elif not wanted:
                await trio.to_thread.run_sync(self.vip.remove)
                if self.held:
                    log.info("dropped the virtual IP", vip=self.vip.address)
                self.held = False
        except OSError as exc:
            self.errors += 1
            log.error("virtual IP change failed", vip=self.vip.address, error=str(exc))

    async def _announce(self) -> None:
        delay = self.interval
        for n in range(self.count):
            if not (self.wanted and self.held) or not self.fence.ok():
                return
            try:
                self.vip.announce()
                self.announced += 1
            except OSError as exc:
                self.errors += 1
                log.warning("gratuitous ARP failed", vip=self.vip.address, error=str(exc))
                return
            if n + 1 < self.count:
                await trio.sleep(delay)
                delay *= 2
