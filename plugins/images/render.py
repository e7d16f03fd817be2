"""``rackboot image ...`` output for a person (``--json`` prints the node's answer as is)."""

from __future__ import annotations

import datetime as dt
from typing import Any


def _when(created: float) -> str:
    return dt.datetime.fromtimestamp(created, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def render_added(result: dict[str, Any]) -> str:
    by = result.get("committed_by") or "this node"
    where = f"committed to the rack's state (by {by})" if result["committed"] else (
        "kept on this node only: it does not hold the rack's lease and no appliance "
        "that does took it")  # fmt: skip
    return (f"added {result['image']}: {_size(result['size'])} in {result['chunks']} chunks, "
            f"sha256 {result['sha256']}; {where}")  # fmt: skip


def render_list(result: list[dict[str, Any]]) -> str:
    if not result:
        return "no images"
    lines = []
    for image in result:
        for v in image["versions"]:
            mark = "*" if v["version"] == image["current"] else " "
            lines.append(f"{mark} {v['image']:<40} {_size(v['size']):>11}  {v['chunks']:>7} chunks"
                         f"  {_when(v['created'])}  {v['signer']}")  # fmt: skip
    return "\n".join(lines + ["(* = the version served)"])


def render_show(result: dict[str, Any]) -> str:
    c = result["chunker"]
    return "\n".join([
        f"image     {result['image']}{'  (served)' if result['current'] else ''}",
        f"size      {result['size']} bytes ({_size(result['size'])})",
        f"sha256    {result['sha256']}",
        f"chunks    {result['chunks']} (min/avg/max {c['min']}/{c['avg']}/{c['max']} bytes)",
        f"table     {result['table']}",
        f"created   {_when(result['created'])} by {result['signer']}",
        f"file      {result['path']}",
    ] + [f"  {chunk}  @{offset:<12} {size}" for chunk, offset, size in result.get("chunk_table", [])])  # fmt: skip


def render_verified(result: dict[str, Any]) -> str:
    return f"{result['image']}: ok (every chunk and the whole file match the signed head)"


def render_removed(result: dict[str, Any]) -> str:
    gone = result["removed"]
    text = "removed " + ", ".join(gone) if gone else "nothing to remove"
    return (
        text
        if result["committed"]
        else text + " (on this node only: it does not hold the rack's lease)"
    )
