"""One node's image service: its store, signing identity, follower and control handlers.

Adding a version cuts and copies the file in a worker thread (a 1 GiB image
takes seconds), signs its head with this node's cluster key (or, without a
cluster identity, with a key of its own under the store) and, where this node
holds the rack's lease, commits the head to the state log (namespace
``images``, key ``NAME@VERSION``; ``images.current``: NAME -> the version
served); elsewhere it offers the head to the peers (routes.py). See docs/images.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from appliance.cluster import pki
from appliance.cluster.files import write_atomically
from appliance.control import ControlRequestError
from appliance.ha.schema import parse_member
from appliance.logs import get_logger
from appliance.state.store import NotWriter
from plugins.httpboot.script import IMAGE

from .follow import CURRENT_NS, HEADS_NS, REMOVED_NS, Follower
from .manifest import BadManifest, Head, Params, public_raw, seal
from .peer import Peer, PeerError
from .store import ImageError, ImageStore
from .sync import Syncer

if TYPE_CHECKING:
    from appliance.node import Node

log = get_logger("images")

LOCAL_KEY = "local-signing.key"


def sync_peers(node: Node) -> list[Peer]:
    """The HTTP servers to sync from: ``[images] peers``, else the hosts of ``[ha] peers``
    at this node's httpboot port (the rack's appliances share one configuration)."""
    listed = node.config["images"].peers
    if not listed:
        httpboot = node.config.sections.get("httpboot")
        port = httpboot.port if httpboot is not None else 80
        listed = [
            f"{parse_member(m)[1].rpartition(':')[0]}:{port}" for m in node.config["ha"].peers
        ]
    return [Peer(host, int(port)) for host, _, port in (a.rpartition(":") for a in listed)]


def profile_images(node: Node) -> frozenset[str]:
    """Images the boot profiles load (``image:NAME`` as kernel or initrd)."""
    httpboot = node.config.sections.get("httpboot")
    files = [f for p in (httpboot.profiles if httpboot else ()) for f in (p.kernel, *p.initrd)]
    return frozenset(f.removeprefix(IMAGE) for f in files if f.startswith(IMAGE))


def chunk_params(settings: Any) -> Params:
    return Params(settings.min_chunk, settings.avg_chunk, settings.max_chunk)


class ImageService:
    """One node's store, its signing identity and its control handlers."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.settings = node.config["images"]
        root = Path(self.settings.root) if self.settings.root else node.data_dir / "images"
        self.store = ImageStore(root, self.trust)
        self.local_key: Ed25519PrivateKey | None = None
        self.lock = trio.Lock()  # one writer of the store at a time
        self.syncer = Syncer(self.store, rate=float(self.settings.max_rate))
        self.follower = Follower(node.state, self.store, self.syncer, sync_peers(node), self.lock,
                                 profile_images(node))  # fmt: skip

    async def run(self, node: Node, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if not self.settings.root:
            node.plugin_dir("images")
        await trio.to_thread.run_sync(self._load)
        for problem in self.store.problems:
            log.warning("image version refused", detail=problem)
        log.info("image store", root=str(self.store.root), images=len(self.store.images))
        task_status.started()
        await self.follower.run()

    def _load(self) -> None:
        self.store.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        key_path = self.store.root / LOCAL_KEY
        if key_path.exists():
            self.local_key = pki.key_from_pem(key_path.read_bytes())
        else:
            self.local_key = pki.new_key()
            write_atomically(key_path, pki.key_to_pem(self.local_key), 0o600)
        self.store.load()

    # -- signing ----------------------------------------------------------------

    def _local_signer(self) -> str:
        assert self.local_key is not None
        return "local:" + pki.public_id(self.local_key.public_key())

    def _seal(self, head: Head) -> bytes:
        identity = self.node.cluster.identity
        if identity is not None:
            signed = dataclasses.replace(head, signer=identity.node_id)
            return seal(signed, identity.key, pki.cert_der(identity.cert))
        assert self.local_key is not None
        return seal(dataclasses.replace(head, signer=self._local_signer()), self.local_key)

    def trust(self, cert_der: bytes, public: bytes, head: Head) -> Ed25519PublicKey:
        """A cluster member's certificate (checked against the CA and revocations, at
        the time the head says it was signed), or this node's own local key."""
        if not cert_der:
            local = self.local_key
            if local is None or public != public_raw(local.public_key()):
                raise BadManifest("signed by a local key of another node (no certificate)")
            return local.public_key()
        identity = self.node.cluster.identity
        if identity is None:
            raise BadManifest("signed by a cluster member, but this node has no cluster identity")
        try:
            member = pki.check_node_cert_untrusted(
                cert_der, identity.ca, identity.revocations.serials,
                dt.datetime.fromtimestamp(head.created, dt.UTC),
            )  # fmt: skip
        except pki.CertificateRefused as exc:
            raise BadManifest(f"signer refused: {exc}") from None
        key = pki.cert_from_der_untrusted(cert_der).public_key()
        if member.node_id != head.signer or public_raw(key) != public:  # type: ignore[arg-type]
            raise BadManifest("the head names another signer than its certificate")
        return key  # type: ignore[return-value]

    async def _forward(self, envelope: bytes) -> str | None:
        """Offer a head this node could not commit to each peer; the one that committed it."""
        for peer in self.follower.peers:
            try:
                async with peer.request("POST", "/images/_heads", body=envelope) as response:
                    async for _ in response.body:
                        pass
            except PeerError:
                continue
            if response.status in (200, 201):
                return str(peer)
        return None

    # -- control handlers -----------------------------------------------------------

    async def add(self, args: dict[str, Any]) -> dict[str, Any]:
        name, path, version = _text(args, "name"), _text(args, "file"), args.get("version")
        if version is not None and not isinstance(version, str):
            raise ControlRequestError("version must be text")
        async with self.lock:  # with the commit: the follower reads the rack's choice after
            found = await self._store_call(
                self.store.add, name, Path(path), version, chunk_params(self.settings), self._seal,
                time.time(),
            )  # fmt: skip
            committed = await self.commit({found.head.key: found.envelope},
                                           {name: found.head.version})  # fmt: skip
        via = None if committed else await self._forward(found.envelope)
        log.info("image added", image=found.head.key, bytes=found.head.size,
                 chunks=found.head.chunks, committed=committed)  # fmt: skip
        return {**_head_json(found.head), "committed": committed or via is not None,
                "committed_by": "this node" if committed else via}  # fmt: skip

    async def list(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"name": name, "current": self.store.current.get(name),
             "versions": [_head_json(v.head) for v in sorted(versions.values(),
                                                            key=lambda v: v.head.created)]}
            for name, versions in sorted(self.store.images.items())
        ]  # fmt: skip

    async def show(self, args: dict[str, Any]) -> dict[str, Any]:
        found = self._get(args)
        shown = {
            **_head_json(found.head), "path": str(found.path),
            "current": self.store.current.get(found.head.name) == found.head.version,
        }  # fmt: skip
        if args.get("chunks"):  # ~90 bytes of JSON a chunk: 1.2 MB for 1 GiB
            table = found.table
            shown["chunk_table"] = [
                [chunk.hex(), offset, size]
                for chunk, offset, size in zip(table.ids, table.offsets(), table.sizes, strict=True)
            ]
        return shown

    async def verify(self, args: dict[str, Any]) -> dict[str, Any]:
        found = self._get(args)
        problem = await self._store_call(self.store.verify, found.head.name, found.head.version)
        if problem is not None:  # an error: the CLI exits non-zero
            log.error("image damaged", image=found.head.key, detail=problem)
            raise ControlRequestError(f"{found.head.key} is damaged: {problem}")
        return {"image": found.head.key, "ok": True}

    def _holder_only(self, what: str) -> None:
        """Removing is the rack's decision: on a standby the follower would only fetch
        a committed version back."""
        if not self.node.state.fence.ok():
            raise ControlRequestError(
                f"{what} changes the rack's images: run it on the active appliance "
                "(this one does not hold the rack's lease)"
            )

    async def remove(self, args: dict[str, Any]) -> dict[str, Any]:
        self._holder_only("image rm")
        found = self._get(args)
        name = found.head.name
        async with self.lock:
            await self._store_call(self.store.remove, name, found.head.version)
            committed = await self.commit({found.head.key: None},
                                           {name: self.store.current.get(name)})  # fmt: skip
        return {"removed": [found.head.key], "committed": committed}

    async def gc(self, args: dict[str, Any]) -> dict[str, Any]:
        self._holder_only("image gc")
        keep = args.get("keep") or self.settings.keep_versions
        if not isinstance(keep, int) or keep < 1:
            raise ControlRequestError("keep must be a whole number >= 1")
        async with self.lock:
            removed = await self._store_call(self.store.gc, keep)
            gone = {key: None for key in removed if "@" in key and " " not in key}
            wanted = {k for k, head in self.node.state.scan(HEADS_NS) if head is not None}
            removed += await self._store_call(self.store.prune_partials, wanted - set(gone))
            committed = await self.commit(gone, {}) if gone else True
        return {"removed": removed, "committed": committed}

    # -- helpers ------------------------------------------------------------------

    def _get(self, args: dict[str, Any]):
        version = args.get("version")
        if version is not None and not isinstance(version, str):
            raise ControlRequestError("version must be text")
        try:
            return self.store.get(_text(args, "name"), version)
        except ImageError as exc:
            raise ControlRequestError(str(exc)) from None

    async def _store_call(self, fn, *args):
        try:
            return await trio.to_thread.run_sync(fn, *args)
        except (ImageError, BadManifest) as exc:
            raise ControlRequestError(str(exc)) from None
        except OSError as exc:
            raise ControlRequestError(f"{exc.filename or 'image store'}: {exc.strerror}") from None

    async def commit(self, heads: dict[str, bytes | None], current: dict[str, str | None]) -> bool:
        """Record the change in the rack's state log; False where this node may not
        write it (not the lease's holder): the version stays local."""
        try:
            for key, envelope in heads.items():
                await self.node.state.put(HEADS_NS, key, envelope)
                # a tombstone: a replayed head of a removed version is refused (http_post_head)
                await self.node.state.put(REMOVED_NS, key, True if envelope is None else None)
            for name, version in current.items():
                await self.node.state.put(CURRENT_NS, name, version)
        except NotWriter:
            return False
        return True

    def status(self) -> dict[str, Any]:
        store = self.store
        committed = {key for key, value in self.node.state.scan(HEADS_NS) if value is not None}
        local = {f"{n}@{v}" for n, vs in store.images.items() for v in vs}
        return {
            "sync": {
                **self.syncer.stats.as_dict(),
                "peers": [str(p) for p in self.follower.peers],
                "failing": dict(self.follower.failing),
            },  # fmt: skip
            "root": str(store.root),
            "images": {name: store.current.get(name) for name in sorted(store.images)},
            "versions": len(local),
            "bytes": sum(v.head.size for vs in store.images.values() for v in vs.values()),
            "chunks_indexed": len(store.index),
            "missing": sorted(committed - local),  # committed in the rack, not here (yet)
            "refused": list(store.problems),
        }


def _text(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise ControlRequestError(f"{key} must be given")
    return value


def _head_json(head: Head) -> dict[str, Any]:
    return {
        "image": head.key, "name": head.name, "version": head.version, "size": head.size,
        "sha256": head.sha256.hex(), "chunks": head.chunks,
        "chunker": {"min": head.params.min_size, "avg": head.params.avg_size,
                    "max": head.params.max_size},
        "table": head.table.hex(), "created": head.created, "signer": head.signer,
    }  # fmt: skip
