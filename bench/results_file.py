"""Where a benchmark's ``--json`` results go: one file per run under bench/results/."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def save(kind: str, stamp: str, target: str, args: dict, results: dict) -> Path:
    """Write ``{time, args, results}``; ``target`` '' means ``bench/results/KIND-STAMP.json``."""
    path = Path(target) if target else RESULTS / f"{kind}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"time": stamp, "args": args, "results": results}, indent=2))
    print(f"results: {path}")
    return path
