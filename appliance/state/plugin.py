"""What the core plugin adds for state: the store every plugin writes through, and, on an
appliance of a rack with ``[ha]`` peers, replication to and from the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from appliance.api import Service
from appliance.ha.schema import parse_member
from appliance.state.store import StateStore


def services(node: Any) -> list[Service]:
    from appliance.state.metrics import StateCollector

    node.state = StateStore(Path(node.data_dir) / "state", node.fence)
    node.metrics.register(StateCollector(lambda: status(node)))
    return [Service("state", run)]


async def run(node: Any, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    store: StateStore = node.state
    await trio.to_thread.run_sync(store.load)
    settings = node.config["ha"]
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        if settings.backend == "embedded" and settings.peers and node.cluster.identity:
            from appliance.state.service import Replication

            # Replication listens on TCP one port above each appliance's election port.
            peers = {}
            for node_id, address in map(parse_member, settings.peers):
                host, _, port = address.rpartition(":")
                peers[node_id] = (host, int(port) + 1)
            node.replication = Replication(node, store, peers, str(settings.listen), settings.port + 1)
            node.replication.known_epoch = lambda: _known_epoch(node)
            node.replication.rule.max_clock_skew = settings.max_clock_skew
            store.policy = node.replication  # the leader commits what the standbys have
            await nursery.start(node.replication.run)
        task_status.started()


def _known_epoch(node: Any) -> int:
    ha = getattr(node, "ha", None)
    return ha.durable.epoch if ha is not None else 0


def status(node: Any) -> dict[str, Any]:
    out = node.state.status()
    replication = getattr(node, "replication", None)
    if replication is not None:
        out["replication"] = replication.status()
    return out
