"""mDNS discovery: python-zeroconf in its own thread, bridged into trio.

The node announces ``_rackboot._tcp`` (TXT: node id, name, rack, short CA
fingerprint, version, role) and browses for the same type. Zeroconf calls
its handlers in its own thread; they resolve the service there and hand an
:class:`Announcement` to trio with ``trio.from_thread.run_sync`` into a
bounded memory channel. A full channel drops the announcement and counts it
(the next periodic re-announcement brings it back).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import socket
from dataclasses import dataclass

import trio

from appliance.logs import get_logger

log = get_logger("cluster.mdns")

SERVICE_TYPE = "_rackboot._tcp.local."
CHANNEL_SIZE = 64
RESOLVE_TIMEOUT_MS = 3000
CLOSE_TIMEOUT = 3.0


@dataclass(frozen=True)
class Announcement:
    instance: str
    removed: bool = False
    node_id: str = ""
    cluster: str = ""  # short CA fingerprint
    name: str = ""
    rack: str = ""
    version: str = ""
    role: str = ""
    address: str = ""  # host:port


def local_ipv4_addresses() -> list[str]:
    """Every non-loopback IPv4 address of this host (for 0.0.0.0 listeners)."""
    import ifaddr  # a dependency of zeroconf

    found = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ipaddress.IPv4Address(ip.ip).is_loopback:
                found.append(ip.ip)
    return found


def _txt(properties: dict) -> dict[str, str]:
    out = {}
    for key, value in (properties or {}).items():
        if isinstance(key, bytes) and isinstance(value, bytes):
            with contextlib.suppress(UnicodeDecodeError):
                out[key.decode()[:32]] = value.decode()[:128]
    return out


class Discovery:
    def __init__(
        self, *, instance: str, port: int, addresses: list[str], txt: dict[str, str],
        interfaces: list[str] | None = None,
    ) -> None:  # fmt: skip
        self.instance = instance
        self.port = port
        self.addresses = addresses
        self.txt = txt
        self.interfaces = interfaces
        self.send, self.receive = trio.open_memory_channel[Announcement](CHANNEL_SIZE)
        self.dropped = 0
        self.delivered = 0
        self._token: trio.lowlevel.TrioToken | None = None

    # -- trio side ------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, ServiceInfo, Zeroconf

        self._token = trio.lowlevel.current_trio_token()
        zc = await trio.to_thread.run_sync(
            functools.partial(
                Zeroconf,
                interfaces=self.interfaces or InterfaceChoice.All,
                ip_version=IPVersion.V4Only,
            )
        )
        info = ServiceInfo(
            SERVICE_TYPE,
            f"{self.instance}.{SERVICE_TYPE}",
            port=self.port,
            properties=self.txt,
            addresses=[socket.inet_aton(a) for a in self.addresses],
            server=f"{self.instance}.local.",
        )
        browser = None
        try:
            browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[self._on_change])
            task_status.started()
            # Probing and the first announcements block for a second or two.
            await trio.to_thread.run_sync(
                functools.partial(zc.register_service, info, allow_name_change=True),
                abandon_on_cancel=True,
            )
            log.info("announcing", service=info.name, port=self.port, addresses=self.addresses)
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await trio.to_thread.run_sync(
                    functools.partial(self._close, zc, browser, info), abandon_on_cancel=True
                )
            await self.send.aclose()

    def _offer(self, announcement: Announcement) -> None:
        try:
            self.send.send_nowait(announcement)
            self.delivered += 1
        except trio.WouldBlock:
            self.dropped += 1
        except trio.ClosedResourceError:
            pass

    # -- zeroconf's thread --------------------------------------------------------

    def _deliver(self, announcement: Announcement) -> None:
        try:
            trio.from_thread.run_sync(self._offer, announcement, trio_token=self._token)
        except (trio.RunFinishedError, trio.Cancelled):
            pass

    def _on_change(self, zeroconf, service_type: str, name: str, state_change) -> None:
        from zeroconf import ServiceStateChange

        instance = name.removesuffix("." + SERVICE_TYPE)
        if state_change is ServiceStateChange.Removed:
            self._deliver(Announcement(instance, removed=True))
            return
        try:
            info = zeroconf.get_service_info(service_type, name, timeout=RESOLVE_TIMEOUT_MS)
        except Exception as exc:  # a malformed record must not kill zeroconf's thread
            log.debug("cannot resolve", service=name, error=f"{type(exc).__name__}: {exc}")
            return
        if info is None or not info.port:
            return
        txt = _txt(info.properties)
        addresses = [a for a in info.parsed_addresses() if ":" not in a]
        if not addresses:
            return
        self._deliver(
            Announcement(
                instance=instance, node_id=txt.get("node", ""), cluster=txt.get("cluster", ""),
                name=txt.get("name", ""), rack=txt.get("rack", ""), version=txt.get("version", ""),
                role=txt.get("role", ""), address=f"{addresses[0]}:{info.port}",
            )
        )  # fmt: skip

    @staticmethod
    def _close(zc, browser, info) -> None:
        try:
            if browser is not None:
                browser.cancel()
            with contextlib.suppress(Exception):
                zc.unregister_service(info)
        finally:
            zc.close()
