"""``rackboot witness``: an acceptor-only process (trio shell) for a management host or a
neighbouring rack. No DHCP, no plugins, and nothing written to disk but a newer
revocation list.

It needs a cluster identity (``rackboot cluster join TOKEN`` on the witness
host, once) to sign its answers and check the appliances' signatures, and it
reads its ``[ha]`` listen address, port and lease from the configuration.
It votes for any rack of its cluster that asks, one acceptor per rack. It
keeps no epoch across restarts: after one it votes for nobody for a lease
period, then answers as *amnesic* until it has accepted a proposal (see
docs/ha.md, "The witness and epochs").

It runs no cluster service, so it learns of a member removed with ``rackboot
cluster remove`` from the appliances: a list newer than its own arrives over
the election port (:mod:`appliance.ha.udp`) and is in force from that
datagram on. It is also written to ``crl.der`` beside the witness's
certificate (atomically, in a worker thread, only over an older one), because
forgetting it is not safe the way forgetting an epoch is: a restarted witness
that voted by its old list would give a removed appliance of a two-appliance
rack the second vote it needs whenever the other appliance is down, and
nobody would be left to teach it.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import trio

from appliance.cluster import pki
from appliance.cluster.files import ClusterFiles, write_atomically
from appliance.ha.election import AcceptorSet
from appliance.ha.runner import TrioClock, WitnessRunner
from appliance.ha.udp import UdpTransport
from appliance.logs import get_logger

log = get_logger("witness")


class Witness:
    def __init__(
        self, identity: Any, listen: str, port: int, lease: float, crl_path: Path | None = None
    ) -> None:
        """``crl_path``: where a newer revocation list is kept (the identity's ``crl.der``)."""
        self.identity = identity
        self.crl_path = crl_path or Path(identity.cert_path).with_name("crl.der")
        self.transport = UdpTransport(identity, listen, port, adopt=self._learnt)
        self.acceptors = AcceptorSet(lease, 0.0)
        self.runner: WitnessRunner | None = None
        self._to_keep: pki.Revocations | None = None
        self._keep = trio.Event()

    async def run(self, *, handle_signals: bool = True, task_status=trio.TASK_STATUS_IGNORED):
        self.acceptors.started = trio.current_time()  # the restart wait starts now
        await self.transport.bind([])
        self.runner = WitnessRunner(self.acceptors, self.transport.send, clock=TrioClock())
        log.info(
            "witness voting", node_id=self.identity.node_id, port=self.transport.port,
            max_lease=self.acceptors.max_lease, revocation_list=self.revocation_list,
        )  # fmt: skip
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.transport.serve, self.runner.deliver)
                nursery.start_soon(self.runner.run)
                nursery.start_soon(self._keep_crls)
                if handle_signals:
                    nursery.start_soon(self._until_signal, nursery.cancel_scope)
                task_status.started(self)
        finally:
            self.transport.close()
            log.info("witness stopped")

    @property
    def revocation_list(self) -> int:
        """The number of the list this witness votes by."""
        return self.transport.opener.revocations.number

    def _learnt(self, crl: pki.Revocations) -> None:
        """A newer list, in force already: keep it on disk too (the newest, once)."""
        self._to_keep = crl
        self._keep.set()

    async def _keep_crls(self) -> None:
        while True:
            await self._keep.wait()
            self._keep = trio.Event()
            crl = self._to_keep
            assert crl is not None
            try:
                await trio.to_thread.run_sync(keep_crl, self.crl_path, crl, self.identity.ca)
            except OSError as exc:  # still in force in memory; lost at a restart
                log.error(
                    "cannot keep the revocation list: a restart would forget it",
                    path=str(self.crl_path), number=crl.number, reason=exc.strerror,
                )  # fmt: skip
            else:
                log.info("revocation list kept", path=str(self.crl_path), number=crl.number)

    async def _until_signal(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("stopping", signal=signal.Signals(signum).name)
                scope.cancel()
                return

    def status(self) -> dict[str, Any]:
        return {
            "node_id": self.identity.node_id,
            "port": self.transport.port,
            "revocation_list": self.revocation_list,
            "racks": self.acceptors.status(trio.current_time()),
            **self.transport.counters,
            "dropped": dict(self.transport.dropped),
        }


def keep_crl(path: Path, crl: pki.Revocations, ca: Any) -> None:
    """Write ``crl`` over ``path`` unless that holds a list as new (blocking)."""
    try:
        if pki.crl_from_der_untrusted(path.read_bytes(), ca).number >= crl.number:
            return
    except (OSError, pki.CertificateRefused):
        pass  # none yet, or unreadable: ours is the one to keep
    write_atomically(path, crl.der, 0o644)


def load_identity(data_dir: str):
    return ClusterFiles(data_dir).load(pki.utc(time.time()))
