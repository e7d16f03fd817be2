"""``rackboot witness``: an acceptor-only process (trio shell) for a management host or a
neighbouring rack. No DHCP, no plugins, nothing written to disk.

It needs a cluster identity (``rackboot cluster join TOKEN`` on the witness
host, once) to sign its answers and check the appliances' signatures, and it
reads its ``[ha]`` listen address, port and lease from the configuration.
It votes for any rack of its cluster that asks, one acceptor per rack. It
keeps no epoch across restarts: after one it votes for nobody for a lease
period, then answers as *amnesic* until it has accepted a proposal (see
docs/ha.md, "The witness and epochs").
"""

from __future__ import annotations

import signal
import time
from typing import Any

import trio

from appliance.cluster import pki
from appliance.cluster.files import ClusterFiles
from appliance.ha.election import AcceptorSet
from appliance.ha.runner import TrioClock, WitnessRunner
from appliance.ha.udp import UdpTransport
from appliance.logs import get_logger

log = get_logger("witness")


class Witness:
    def __init__(self, identity: Any, listen: str, port: int, lease: float) -> None:
        self.identity = identity
        self.transport = UdpTransport(identity, listen, port)
        self.acceptors = AcceptorSet(lease, 0.0)
        self.runner: WitnessRunner | None = None

    async def run(self, *, handle_signals: bool = True, task_status=trio.TASK_STATUS_IGNORED):
        self.acceptors.started = trio.current_time()  # the restart wait starts now
        await self.transport.bind([])
        self.runner = WitnessRunner(self.acceptors, self.transport.send, clock=TrioClock())
        log.info(
            "witness voting", node_id=self.identity.node_id, port=self.transport.port,
            max_lease=self.acceptors.max_lease,
        )  # fmt: skip
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.transport.serve, self.runner.deliver)
                nursery.start_soon(self.runner.run)
                if handle_signals:
                    nursery.start_soon(self._until_signal, nursery.cancel_scope)
                task_status.started(self)
        finally:
            self.transport.close()
            log.info("witness stopped")

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
            "racks": self.acceptors.status(trio.current_time()),
            **self.transport.counters,
            "dropped": dict(self.transport.dropped),
        }


def load_identity(data_dir: str):
    return ClusterFiles(data_dir).load(pki.utc(time.time()))
