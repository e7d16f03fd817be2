"""A small TOML writer for what :mod:`tomllib` reads back from a configuration file.

``tomllib.loads(dumps(doc)) == doc`` for every document of tables, arrays,
strings, integers, floats, booleans and dates (tests/unit/setup/test_tomlwrite.py).
Comments of the original file are not kept: the file is regenerated from its values.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def dumps(doc: dict[str, Any], header: str = "") -> str:
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    _table(doc, (), lines, array=False)
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines) + "\n"


def key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else string(name)


def string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def value(item: Any) -> str:
    """One inline value (arrays and tables inline too)."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, float):
        if math.isnan(item):
            return "nan"
        if math.isinf(item):
            return "inf" if item > 0 else "-inf"
        return repr(item)
    if isinstance(item, str):
        return string(item)
    if isinstance(item, datetime.datetime | datetime.date | datetime.time):
        return item.isoformat()
    if isinstance(item, list | tuple):
        return "[" + ", ".join(value(v) for v in item) + "]"
    if isinstance(item, dict):
        return "{" + ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items()) + "}"
    raise TypeError(f"no TOML form for {type(item).__name__}")


def _is_table_array(item: Any) -> bool:
    return isinstance(item, list | tuple) and bool(item) and all(isinstance(v, dict) for v in item)


def _table(table: dict[str, Any], path: tuple[str, ...], lines: list[str], *, array: bool) -> None:
    """Scalars first (they belong to this header), then sub-tables, then arrays of tables."""
    if path:
        name = ".".join(key(p) for p in path)
        lines.extend(["", f"[[{name}]]" if array else f"[{name}]"])
    nested = []
    for name, item in table.items():
        if isinstance(item, dict) or _is_table_array(item):
            nested.append((name, item))
        else:
            lines.append(f"{key(name)} = {value(item)}")
    for name, item in nested:
        if isinstance(item, dict):
            _table(item, (*path, name), lines, array=False)
        else:
            for element in item:
                _table(element, (*path, name), lines, array=True)
