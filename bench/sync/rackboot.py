"""Rackboot's side of bench.sync: the images plugin's sync (plugins/images/sync.py).

The sources: ``rackboot run`` in ``src1`` and ``src2`` (the httpboot and images
plugins only, httpboot on port 80 of the namespace's address, pinned like rsync's
daemon), their stores signing with one key, so a version added to both has one
chunk table. Each version is added to both stores once (``rackboot image add``,
untimed: what publishing costs is reported apart, as ``add_seconds``).

The destination: ``python -m bench.sync.rackboot fetch`` in ``dst``, the same code
a standby's follower runs for a committed head it lacks (``Syncer.fetch``), on a
store under dst's directory that already holds the basis version (and the ones
before it, as an appliance would): it fetches the chunk table as a delta, seeds
what it holds, fetches the rest in Range runs, checks every chunk and the whole
file, and renames it in. Timed from the process's start to its exit, like
rsync's client (Python's start-up and imports included, ~0.5 s here, which a
running appliance does not pay); its own ``sync_seconds`` is the fetch alone. ``full`` fetches from src1 and src2 at once (``--full-peers``);
the edits from src1 alone, as a rack's standby has one peer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from appliance import control
from appliance.cluster import pki

IMAGE = "boot"
ROOT = Path(__file__).resolve().parents[2]


class Rackboot:
    name = "rackboot"

    def __init__(self, ctx: Any, chunks: tuple[int, int, int] = (16384, 65536, 262144),
                 full_peers: int = 2) -> None:  # fmt: skip
        from tests.support.nodeproc import start_node

        self.ctx, self.chunks, self.full_peers = ctx, chunks, full_peers
        self.dir = ctx.dst_root / "rackboot"
        self.dir.mkdir(mode=0o755)
        self.key = ctx.work / "rackboot-signing.pem"
        self.key.write_bytes(pki.key_to_pem(pki.new_key()))
        self.sources: dict[str, tuple[Any, Path]] = {}
        self.added: dict[str, float] = {}  # version -> seconds to add it (src1)
        for name in ("src1", "src2"):
            host = getattr(ctx, name)
            work = ctx.work / f"rackboot-{name}"
            (work / "images").mkdir(parents=True)
            shutil.copy(self.key, work / "images" / "local-signing.key")
            config = work / "rackboot.toml"
            config.write_text(
                '[plugins]\ndisabled = ["dhcp", "tftp"]\n'
                f'[node]\nname = "{name}"\ndata_dir = "{work / "data"}"\n'
                f'[httpboot]\naddresses = ["{host.addr}"]\nport = 80\n'
                "bind_tokens_to_lease = false\n"
                f'[images]\nroot = "{work / "images"}"\nmin_chunk = {chunks[0]}\n'
                f"avg_chunk = {chunks[1]}\nmax_chunk = {chunks[2]}\n"
            )
            sock = work / "data" / "control.sock"
            start_node(host, config, sock, work, "httpboot",
                       prefix=("taskset", "-c", ctx.server_cpu))  # fmt: skip
            self.sources[name] = (host, sock)
        self.holds: list[str] = []  # versions dst's store holds
        self.description = (
            f"rackboot images sync: `rackboot run` (httpboot + images) in src1 and src2 "
            f"(taskset -c {ctx.server_cpu}), chunks min/avg/max {'/'.join(map(str, chunks))}; "
            f"in dst (taskset -c {ctx.client_cpu}) `python -m bench.sync.rackboot fetch` "
            f"(Syncer.fetch, as a standby's follower): full from {full_peers} peer(s), "
            "edits from src1"
        )

    def _publish(self, version: str) -> None:
        if version in self.added:
            return
        path = str(self.ctx.versions[version].path)
        for name, (_, sock) in self.sources.items():
            started = time.monotonic()
            control.call(str(sock), "images.add", {"name": IMAGE, "file": path,
                                                   "version": version}, timeout=1800)  # fmt: skip
            if name == "src1":
                self.added[version] = time.monotonic() - started

    def prepare(self, step: Any) -> None:
        self._publish(step.version)
        if step.basis is None:
            shutil.rmtree(self.dir / "store", ignore_errors=True)
            self.holds = []
            return
        for version in ("v1", "v2", "v3", "v4"):  # what an appliance would hold by then
            if version not in self.holds:
                self._publish(version)
                self._fetch(version, peers=1)
            if version == step.basis:
                break

    def sync(self, step: Any) -> dict:
        figures = self._fetch(step.version, self.full_peers if step.basis is None else 1)
        figures["add_seconds"] = round(self.added[step.version], 3)
        return figures

    def result(self, step: Any) -> Path:
        return self.dir / "store" / "files" / IMAGE / step.version

    def _fetch(self, version: str, peers: int) -> dict:
        src1 = self.ctx.work / "rackboot-src1" / "images"
        envelope = src1 / "heads" / IMAGE / f"{version}.head"
        addresses = [f"{getattr(self.ctx, n).addr}:80" for n in ("src1", "src2")[:peers]]
        argv = ["taskset", "-c", self.ctx.client_cpu, sys.executable, "-m", "bench.sync.rackboot",
                "fetch", "--store", str(self.dir / "store"), "--key", str(self.key),
                "--envelope", str(envelope), "--peers", ",".join(addresses)]  # fmt: skip
        res = self.ctx.dst.run(argv, timeout=self.ctx.timeout, cwd=ROOT)
        if res.returncode != 0:
            raise RuntimeError(f"rackboot fetch exited {res.returncode}: {res.stderr[-800:]}")
        self.holds.append(version)
        return json.loads(res.stdout.strip().splitlines()[-1])


def fetch_main(argv: list[str]) -> int:
    """In dst: bring the store to the version ``--envelope`` names, print the figures."""
    p = argparse.ArgumentParser(prog="python -m bench.sync.rackboot fetch")
    p.add_argument("--store", required=True)
    p.add_argument("--key", required=True, help="the sources' signing key (PEM): trusted")
    p.add_argument("--envelope", required=True, help="the signed head (a source's heads/ file)")
    p.add_argument("--peers", required=True, help="host:port,... of the sources' HTTP servers")
    args = p.parse_args(argv)

    import trio

    from plugins.images.manifest import BadManifest, public_raw
    from plugins.images.peer import Peer
    from plugins.images.store import ImageStore
    from plugins.images.sync import Syncer

    public = pki.key_from_pem(Path(args.key).read_bytes()).public_key()

    def trust(cert_der: bytes, raw: bytes, head: Any):
        if cert_der or raw != public_raw(public):
            raise BadManifest("not the bench's signing key")
        return public

    store = ImageStore(Path(args.store), trust)
    store.load()
    syncer = Syncer(store)
    peers = [Peer(host, int(port)) for host, _, port in (a.rpartition(":") for a in
                                                          args.peers.split(","))]  # fmt: skip
    envelope = Path(args.envelope).read_bytes()
    started = time.perf_counter()  # after start-up: what a running node's follower spends
    trio.run(syncer.fetch, envelope, peers)
    figures = {**syncer.stats.as_dict(), "sync_seconds": round(time.perf_counter() - started, 3)}
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["fetch"]:
        sys.exit("usage: python -m bench.sync.rackboot fetch --store DIR --key PEM "
                 "--envelope FILE --peers HOST:PORT,...")  # fmt: skip
    sys.exit(fetch_main(sys.argv[2:]))
