"""The images plugin's hooks: ``[images]``, the store service, ``rackboot image ...``.

Adding a version cuts and copies the file in a worker thread (a 1 GiB image
takes seconds), signs its head with this node's cluster key (or, without a
cluster identity, with a key of its own under the store) and, where this node
holds the rack's lease, commits the head to the state log (namespace
``images``, key ``NAME@VERSION``; ``images.current``: NAME -> the version
served). See docs/images.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from appliance.api import Bool, CliCommand, Field, Int, List, Section, Service, Str, hookimpl
from appliance.cluster import pki
from appliance.cluster.files import write_atomically
from appliance.control import ControlRequestError
from appliance.errors import ConfigError
from appliance.ha.schema import parse_member
from appliance.logs import get_logger
from appliance.state.store import NotWriter
from plugins.httpboot.messages import Request, Response, Route
from plugins.httpboot.script import IMAGE

from .follow import CURRENT_NS, HEADS_NS, REMOVED_NS, Follower
from .manifest import (
    MAX_HEAD,
    BadManifest,
    Head,
    Params,
    diff,
    encode_delta,
    open_untrusted,
    public_raw,
    seal,
)
from .peer import Peer, PeerError
from .render import render_added, render_list, render_removed, render_show, render_verified
from .store import ImageError, ImageStore
from .sync import Syncer

if TYPE_CHECKING:
    from appliance.config import Config
    from appliance.node import Node

log = get_logger("images")


SERVED_PREFIX = "images/"  # TFTP: images/NAME; HTTP: /images/NAME
LOCAL_KEY = "local-signing.key"

SECTION = Section(
    "images",
    doc="Boot images: a signed chunk store, served by name (see docs/images.md).",
    fields={
        "enabled": Field(Bool(), default=True, doc="Keep an image store on this node."),
        "root": Field(
            Str(r"(/.{0,4000})?", "'' or an absolute path", max_len=4096),
            default="",
            doc="Where the store lives ('' = <data_dir>/images).",
        ),
        "min_chunk": Field(
            Int(min=64, max=1 << 20),
            default=16 * 1024,
            doc="Smallest chunk in bytes (content-defined chunking).",
        ),  # fmt: skip
        "avg_chunk": Field(
            Int(min=256, max=4 << 20),
            default=64 * 1024,
            doc="Average chunk in bytes (smaller for filesystem images).",
        ),  # fmt: skip
        "max_chunk": Field(
            Int(min=1024, max=16 << 20), default=256 * 1024, doc="Largest chunk in bytes."
        ),  # fmt: skip
        "peers": Field(
            List(
                Str(r"[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}", "a 'host:port' address", max_len=260),
                max_items=16,
            ),
            default=(),
            doc="HTTP boot servers of the appliances to sync images from ('host:port'); "
            "empty: the hosts of [ha] peers, at this node's [httpboot] port.",
        ),
        "max_rate": Field(
            Int(min=0, max=1 << 40),
            default=0,
            doc="Bytes per second a sync may fetch, all peers together (0: no limit).",
        ),
        "keep_versions": Field(
            Int(min=1, max=1000),
            default=2,
            doc="Versions of each image `image gc` keeps, the current one included.",
        ),  # fmt: skip
    },
)


class ImagesPlugin:
    def __init__(self) -> None:
        self.stores: weakref.WeakKeyDictionary[Node, _Node] = weakref.WeakKeyDictionary()

    @hookimpl
    def rackboot_config_schema(self) -> Section:
        return SECTION

    @hookimpl
    def rackboot_configure(self, config: Config) -> None:
        settings = config["images"]
        why = _params(settings).problem()
        if why is not None:
            raise ConfigError(config.source, "images.avg_chunk", why,
                              [settings.min_chunk, settings.avg_chunk, settings.max_chunk])  # fmt: skip

    @hookimpl
    def rackboot_services(self, node: Node) -> list[Service]:
        if not node.config["images"].enabled:
            return []
        state = _Node(node)
        self.stores[node] = state
        return [Service("store", state.run)]

    @hookimpl
    def rackboot_status(self, node: Node) -> dict[str, Any] | None:
        state = self.stores.get(node)
        return None if state is None else state.status()

    @hookimpl
    def rackboot_control_commands(self, node: Node):
        state = self.stores.get(node)
        if state is None:
            return None
        return {
            "images.add": state.add, "images.list": state.list, "images.show": state.show,
            "images.verify": state.verify, "images.rm": state.remove, "images.gc": state.gc,
        }  # fmt: skip

    # -- serving by name (optional: the tftp and httpboot plugins may be disabled) --

    @hookimpl(optionalhook=True)
    def tftp_open(self, path: str, node: Node) -> Path | None:
        """``images/NAME``: the current version of image NAME (a lookup, no I/O)."""
        state = self.stores.get(node)
        name = path.removeprefix(SERVED_PREFIX) if path.startswith(SERVED_PREFIX) else None
        return None if state is None or name is None else state.store.served_path(name)

    @hookimpl(optionalhook=True)
    def httpboot_routes(self, node: Node) -> list[Route] | None:
        state = self.stores.get(node)
        if state is None:
            return None
        return [
            # _table first: "_table" is no image name, but {name}/{version} would match it
            Route("GET", "/images/_table/{digest}", state.http_table, name="image-tables"),
            Route("GET", "/images/{name}/{version}", state.http_version, name="image-versions"),
            Route("GET", "/images/{name}", state.http_image, name="images"),
            Route(
                "POST",
                "/images/_heads",
                state.http_post_head,
                max_body=MAX_HEAD,
                name="image-heads",
            ),  # fmt: skip
        ]

    @hookimpl
    def rackboot_cli_commands(self) -> list[CliCommand]:
        version = (("--version",), {"help": "a version (default: the current one)"})
        return [
            CliCommand(
                ("image", "add"),
                "add a file to the image store as a new version",
                "images.add",
                render_added,
                timeout=3600.0,
                arguments=(
                    (("name",), {"help": "image name"}),
                    (("file",), {"type": _absolute, "help": "the file to add"}),
                    (("--version",), {"help": "version (default: the next integer)"}),
                ),
            ),
            CliCommand(
                ("image", "list"), "list the images of the store", "images.list", render_list
            ),
            CliCommand(
                ("image", "show"),
                "show an image version's head and chunks",
                "images.show",
                render_show,
                arguments=(
                    (("name",), {"help": "image name"}),
                    version,
                    (("--chunks",), {"action": "store_true", "help": "list every chunk"}),
                ),
            ),
            CliCommand(
                ("image", "verify"),
                "read an image version whole against its signed head",
                "images.verify",
                render_verified,
                timeout=3600.0,
                arguments=((("name",), {"help": "image name"}), version),
            ),
            CliCommand(
                ("image", "rm"),
                "remove an image version",
                "images.rm",
                render_removed,
                arguments=(
                    (("name",), {"help": "image name"}),
                    (("--version",), {"required": True, "help": "the version"}),
                ),
            ),
            CliCommand(
                ("image", "gc"),
                "remove old versions and unreferenced files",
                "images.gc",
                render_removed,
                timeout=600.0,
                arguments=((("--keep",), {"type": int, "help": "versions kept per image"}),),
            ),
        ]


def _absolute(path: str) -> str:
    return os.path.abspath(path)  # the node runs elsewhere: the CLI's cwd means nothing there


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


def _params(settings: Any) -> Params:
    return Params(settings.min_chunk, settings.avg_chunk, settings.max_chunk)


class _Node:
    """One node's store, its signing identity and its control handlers."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.settings = node.config["images"]
        root = Path(self.settings.root) if self.settings.root else node.data_dir / "images"
        self.store = ImageStore(root, self._trust)
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

    def _trust(self, cert_der: bytes, public: bytes, head: Head) -> Ed25519PublicKey:
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

    # -- serving ----------------------------------------------------------------------

    def http_image(self, request: Request) -> Response:
        """The current version of an image, whole (Range and conditional requests are
        the server's); only names in the store, never a path built from the request."""
        return _file(self.store.served_path(request.params["name"]))

    def http_version(self, request: Request) -> Response:
        """One complete version: what a peer's sync fetches runs of chunks from."""
        versions = self.store.images.get(request.params["name"], {})
        found = versions.get(request.params["version"])
        return _file(None if found is None else found.path)

    def http_table(self, request: Request) -> Response:
        """A chunk table by digest; ``?base=DIGEST`` of a table the caller holds: the delta
        against it instead (header ``x-rackboot-delta-base``). Checked by the caller."""
        wanted = {v.head.table.hex(): v.table for vs in self.store.images.values()
                  for v in vs.values()}  # fmt: skip
        table = wanted.get(request.params["digest"])
        if table is None:
            return Response.error(404)
        base_hex = request.query.decode("ascii", "replace").removeprefix("base=")
        base = wanted.get(base_hex)
        if base is not None:
            body = encode_delta(table.params, diff(base, table))
            return Response(200, [(b"content-type", b"application/octet-stream"),
                                  (b"x-rackboot-delta-base", base_hex.encode())], body)  # fmt: skip
        return Response(200, [(b"content-type", b"application/octet-stream")], table.encode())

    async def http_post_head(self, request: Request) -> Response:
        """A head added on an appliance of the rack that does not hold the lease: the
        holder commits it (its signature is the authentication: a cluster member made
        it) and then syncs its chunks from the peers, the one that added it among them.
        A version removed in the rack is not brought back by a replayed head (409)."""
        try:
            head = open_untrusted(request.body, self._trust)
        except BadManifest as exc:
            log.warning("posted head refused", client=request.client[0], error=str(exc))
            return Response.error(403, "head refused")
        state = self.node.state
        if state.get(REMOVED_NS, head.key) is not None:
            return Response.error(409, f"{head.key} was removed in the rack")
        known = state.get(HEADS_NS, head.key)
        if known is not None:
            return Response.json({"committed": True}) if known == request.body else (
                Response.error(409, f"{head.key} is committed with another head"))  # fmt: skip
        async with self.lock:
            committed = await self._commit({head.key: request.body}, {head.name: head.version})
        if not committed:
            return Response.unavailable("this appliance does not hold the rack's lease")
        log.info("image committed for a peer", image=head.key, signer=head.signer)
        return Response.json({"committed": True}, 201)

    async def _forward(self, envelope: bytes) -> str | None:
        """Offer a head this node could not commit to each peer; the one that committed it."""
        for peer in self.follower.peers:
            try:
                async with peer.get("/images/_heads", method="POST", body=envelope) as response:
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
                self.store.add, name, Path(path), version, _params(self.settings), self._seal,
                time.time(),
            )  # fmt: skip
            committed = await self._commit({found.head.key: found.envelope},
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

    async def remove(self, args: dict[str, Any]) -> dict[str, Any]:
        found = self._get(args)
        name = found.head.name
        async with self.lock:
            await self._store_call(self.store.remove, name, found.head.version)
            committed = await self._commit({found.head.key: None},
                                           {name: self.store.current.get(name)})  # fmt: skip
        return {"removed": [found.head.key], "committed": committed}

    async def gc(self, args: dict[str, Any]) -> dict[str, Any]:
        keep = args.get("keep") or self.settings.keep_versions
        if not isinstance(keep, int) or keep < 1:
            raise ControlRequestError("keep must be a whole number >= 1")
        async with self.lock:
            removed = await self._store_call(self.store.gc, keep)
            gone = {key: None for key in removed if "@" in key and " " not in key}
            committed = await self._commit(gone, {}) if gone else True
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

    async def _commit(self, heads: dict[str, bytes | None], current: dict[str, str | None]) -> bool:
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


plugin = ImagesPlugin()


def _file(path: Path | None) -> Response:
    if path is None:
        return Response.error(404)
    try:
        handle = open(path, "rb")  # noqa: SIM115 (the server closes it after sending)
    except OSError:  # removed meanwhile (gc): as if it had never been there
        return Response.error(404)
    return Response.file(handle, os.fstat(handle.fileno()), b"application/octet-stream")
