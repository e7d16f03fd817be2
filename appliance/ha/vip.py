"""The rack's virtual IP (trio shell): the guard process holds it, gratuitous ARP announces it.

:class:`VipKeeper` follows a wanted state the election sets synchronously
(:meth:`VipKeeper.want`, :meth:`VipKeeper.renewed`). The address itself is
added, refreshed and removed by the **guard** (appliance/ha/vipguard.py), a
small process of its own: the keeper tells it, after every grant and renewal,
until when this node may hold the address (the fence's end less
``step_down_lead``), and the guard removes it at that moment unless told a
later one, and at once if this process dies. So the VIP leaves this node's
kernel before any acceptor's grant ends, even when this process is killed or
frozen. Once the guard says the address is there, the keeper sends
``garp_count`` gratuitous ARPs spaced ``interval, 2*interval, ...``, each
only while the fence still says yes.
"""

from __future__ import annotations

import ipaddress
import math
import socket
import struct
import subprocess
import sys

import trio

from appliance.clock import boottime
from appliance.ha import vipguard
from appliance.ha.fence import Fence
from appliance.logs import get_logger

log = get_logger("ha")

ETH_P_ARP = 0x0806
BROADCAST = b"\xff" * 6
RESPAWN_DELAY = 1.0  # s before a guard that died is started again
STOP_TIMEOUT = 2.0  # s a guard may take to drop the address when the node stops


def garp_frame(mac: bytes, address: str) -> bytes:
    """An ARP request for ``address`` from ``address`` (RFC 5227 announcement), broadcast."""
    ip = socket.inet_aton(address)
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, ip, b"\x00" * 6, ip)
    return BROADCAST + mac + struct.pack("!H", ETH_P_ARP) + arp


class Vip:
    """The address and its interface; gratuitous ARP on a raw socket (blocking, quick)."""

    def __init__(self, cidr: str, interface: str) -> None:
        iface = ipaddress.IPv4Interface(cidr)
        self.cidr = f"{iface.ip}/{iface.network.prefixlen}"
        self.address = str(iface.ip)
        self.interface = interface

    def guard_argv(self) -> list[str]:
        # -I -S: no site-packages, no user paths; the guard needs the standard library only
        return [sys.executable, "-I", "-S", vipguard.__file__, self.interface, self.cidr]

    def announce(self) -> None:
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP)) as sock:
            sock.bind((self.interface, ETH_P_ARP))
            mac = sock.getsockname()[4][:6]
            sock.send(garp_frame(mac, self.address))


class VipKeeper:
    def __init__(
        self, vip: Vip, fence: Fence, *, count: int, interval: float, lead: float
    ) -> None:
        self.vip = vip
        self.fence = fence
        self.count = count
        self.interval = interval
        self.lead = lead  # the holder steps down this long before its validity ends
        self.wanted = False
        self.held = False  # the guard said the address is there
        self.announced = 0
        self.errors = 0
        self.guard_restarts = 0
        self._told = ""  # the last command the guard got
        self._changed = trio.Event()
        self._stdin: trio.abc.SendStream | None = None
        self._nursery: trio.Nursery | None = None

    def want(self, held: bool) -> None:
        if held != self.wanted:
            self.wanted = held
            self._changed.set()

    def renewed(self) -> None:
        """The fence moved forward: tell the guard the new end."""
        self._changed.set()

    def _command(self) -> str:
        if not (self.wanted and self.fence.ok()):
            return "drop"
        # On the guard's clock (CLOCK_BOOTTIME), whatever clock the fence reads.
        end = boottime() + (self.fence.valid_until - self.fence.clock()) - self.lead
        return f"hold {end:.6f}"

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # A VIP left behind by a crash of this node is not ours until the election says so:
            # the guard starts by removing it.
            await nursery.start(self._guard)
            task_status.started()
            await self._follow()

    async def _follow(self) -> None:
        while True:
            self._changed = trio.Event()
            command = self._command()
            if command != self._told:
                await self._tell(command)
            # wake at the fence's end too, to say drop even if no event comes
            wake = self.fence.valid_until if command != "drop" else math.inf
            with trio.move_on_at(wake):
                await self._changed.wait()

    async def _tell(self, command: str) -> None:
        self._told = command
        if self._stdin is None:
            return  # the guard is being restarted; it gets the command then
        try:
            await self._stdin.send_all(command.encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the guard died: _guard notices, restarts it and says this again

    async def _guard(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the guard; start it again if it dies while the node runs."""
        while True:
            process = await trio.lowlevel.open_process(
                self.vip.guard_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                start_new_session=True,  # signals to the node's process group do not reach it
            )  # fmt: skip
            self._stdin = process.stdin
            try:
                self._told = ""
                await self._tell("drop")
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED
                self._changed.set()  # the current command, from _follow
                await self._read(process)
            finally:
                self._stdin = None
                with trio.CancelScope(shield=True):
                    await self._stop(process)
            self.errors += 1
            self.guard_restarts += 1
            self.held = False
            log.error("the VIP guard died; starting it again", vip=self.vip.address,
                      exit=process.returncode)  # fmt: skip
            await trio.sleep(RESPAWN_DELAY)

    async def _read(self, process) -> None:
        pending = b""
        while chunk := await process.stdout.receive_some(4096):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._heard(line.decode(errors="replace"))

    def _heard(self, line: str) -> None:
        if line == "held":
            if not self.held:
                self.held = True
                log.info("took the virtual IP", vip=self.vip.address, interface=self.vip.interface)
                if self._nursery is not None:
                    self._nursery.start_soon(self._announce)
        elif line == "dropped":
            if self.held:
                log.info("dropped the virtual IP", vip=self.vip.address)
            self.held = False
        else:
            self.errors += 1
            log.error("virtual IP change failed", vip=self.vip.address, error=line)

    async def _stop(self, process) -> None:
        """Close the guard's stdin (it drops the address and exits), then wait for it."""
        if process.stdin is not None:
            await process.stdin.aclose()
        with trio.move_on_after(STOP_TIMEOUT):
            await process.wait()
            return
        log.error("the VIP guard did not stop; killing it", vip=self.vip.address)
        process.kill()
        await process.wait()

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
