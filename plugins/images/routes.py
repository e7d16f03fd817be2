"""The images plugin's HTTP routes, on the httpboot server (httpboot_routes).

``GET /images/NAME``: the current version (what boot profiles load as
``image:NAME``); ``GET /images/NAME/VERSION``: one complete version, what a
peer's sync fetches runs of chunks from with Range requests;
``GET /images/_table/DIGEST[?base=DIGEST]``: a chunk table, or its delta
against one the caller holds; ``POST /images/_heads``: a signed head an
appliance that does not hold the lease offers to the one that does.
Only names and digests the store holds are looked up: nothing of a request is
joined onto a path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import trio

from appliance.logs import get_logger
from plugins.httpboot.messages import Request, Response, Route

from .follow import HEADS_NS, REMOVED_NS
from .manifest import MAX_HEAD, BadManifest, diff, encode_delta, open_untrusted
from .patch import CONTENT_TYPE, make_patch

if TYPE_CHECKING:
    from .service import ImageService

log = get_logger("images")

MAX_PATCH_SPAN = 32 << 20  # bytes of either side a patch request may make the server read


class ImageRoutes:
    def __init__(self, service: ImageService) -> None:
        self.service = service
        self.store = service.store

    def routes(self) -> list[Route]:
        return [
            # _table first: "_table" is no image name, but {name}/{version} would match it
            Route("GET", "/images/_table/{digest}", self.http_table, name="image-tables"),
            Route("GET", "/images/{name}/{version}", self.http_version, name="image-versions"),
            Route("GET", "/images/{name}", self.http_image, name="images"),
            Route(
                "POST", "/images/_heads", self.http_post_head, max_body=MAX_HEAD, name="image-heads"
            ),  # fmt: skip
        ]

    def http_image(self, request: Request) -> Response:
        """The current version of an image, whole (Range and conditional requests are
        the server's); only names in the store, never a path built from the request."""
        return _file(self.store.served_path(request.params["name"]))

    async def http_version(self, request: Request) -> Response:
        """One complete version: what a peer's sync fetches runs of chunks from (Range).
        ``?base=VERSION&from=A&to=B`` with a one-range ``Range``: the range as a patch of
        bytes A..B-1 of that older version, which the caller holds (patch.py)."""
        versions = self.store.images.get(request.params["name"], {})
        found = versions.get(request.params["version"])
        if found is None:
            return Response.error(404)
        query = parse_qs(request.query.decode("ascii", "replace"))
        base = versions.get(query.get("base", [""])[0])
        ranged = _one_range(request.header(b"range") or b"")
        if base is None or ranged is None:
            return _file(found.path)
        try:
            start, stop = int(query["from"][0]), int(query["to"][0])
        except (KeyError, ValueError):
            return Response.error(400)
        first, last = ranged
        if not (0 <= start < stop <= base.head.size and 0 <= first <= last < found.head.size
                and stop - start <= MAX_PATCH_SPAN and last - first < MAX_PATCH_SPAN):  # fmt: skip
            return Response.error(416)
        body = await trio.to_thread.run_sync(
            _patch, found.path, first, last + 1 - first, base.path, start, stop - start
        )
        return Response(200, [(b"content-type", CONTENT_TYPE)], body)

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
            head = open_untrusted(request.body, self.service.trust)
        except BadManifest as exc:
            log.warning("posted head refused", client=request.client[0], error=str(exc))
            return Response.error(403, "head refused")
        state = self.service.node.state
        # Checked under the lock an `image rm` commits under: a removal between the check
        # and the commit would otherwise be undone (and its tombstone cleared).
        async with self.service.lock:
            if state.get(REMOVED_NS, head.key) is not None:
                return Response.error(409, f"{head.key} was removed in the rack")
            known = state.get(HEADS_NS, head.key)
            if known is not None:
                return Response.json({"committed": True}) if known == request.body else (
                    Response.error(409, f"{head.key} is committed with another head"))  # fmt: skip
            committed = await self.service.commit(
                {head.key: request.body}, {head.name: head.version}
            )
        if not committed:
            return Response.unavailable("this appliance does not hold the rack's lease")
        log.info("image committed for a peer", image=head.key, signer=head.signer)
        return Response.json({"committed": True}, 201)


def _file(path: Path | None) -> Response:
    if path is None:
        return Response.error(404)
    try:
        handle = open(path, "rb")  # noqa: SIM115 (the server closes it after sending)
    except OSError:  # removed meanwhile (gc): as if it had never been there
        return Response.error(404)
    return Response.file(handle, os.fstat(handle.fileno()), b"application/octet-stream")


def _one_range(header: bytes) -> tuple[int, int] | None:
    """``bytes=A-B`` (one closed range), or None."""
    text = header.decode("ascii", "replace").strip()
    if not text.startswith("bytes=") or "," in text:
        return None
    first, _, last = text[6:].partition("-")
    return (int(first), int(last)) if first.isdigit() and last.isdigit() else None


def _patch(
    path: Path, offset: int, size: int, base: Path, base_offset: int, base_size: int
) -> bytes:
    with open(path, "rb") as new, open(base, "rb") as old:
        return make_patch(os.pread(new.fileno(), size, offset),
                          os.pread(old.fileno(), base_size, base_offset))  # fmt: skip
