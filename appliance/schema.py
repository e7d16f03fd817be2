"""Declarative configuration schemas.

Each plugin declares its section with :class:`Section` and :class:`Field`;
the core validates a TOML document against all of them, so every error names
the file, the key path, what was expected and what was found. The same
declarations render ``rackboot config example``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.errors import ConfigError

REQUIRED: Any = object()  # sentinel: the key must be given


class Kind:
    """A value type: checks and converts one TOML value."""

    expected = "a value"

    def check(self, value: Any, source: str, keypath: str) -> Any:
        raise NotImplementedError

    def fail(self, value: Any, source: str, keypath: str, expected: str | None = None):
        raise ConfigError(source, keypath, expected or self.expected, value)

    def to_toml(self, value: Any) -> str:
        return _toml_scalar(value)


class Str(Kind):
    def __init__(self, pattern: str | None = None, hint: str | None = None, max_len: int = 4096):
        self.pattern = re.compile(pattern) if pattern else None
        self.max_len = max_len
        self.expected = hint or "a string"

    def check(self, value, source, keypath):
        if not isinstance(value, str) or len(value) > self.max_len:
            self.fail(value, source, keypath)
        if self.pattern and not self.pattern.fullmatch(value):
            self.fail(value, source, keypath)
        return value


class Bool(Kind):
    expected = "true or false"

    def check(self, value, source, keypath):
        if not isinstance(value, bool):
            self.fail(value, source, keypath)
        return value


class Int(Kind):
    def __init__(self, min: int | None = None, max: int | None = None):
        self.min, self.max = min, max
        bounds = [f">= {min}" if min is not None else "", f"<= {max}" if max is not None else ""]
        qualifier = " and ".join(b for b in bounds if b)
        self.expected = f"an integer {qualifier}".strip()

    def check(self, value, source, keypath):
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(value, source, keypath)
        if (self.min is not None and value < self.min) or (
            self.max is not None and value > self.max
        ):
            self.fail(value, source, keypath)
        return value


class Float(Kind):
    def __init__(self, min: float | None = None, max: float | None = None):
        self.min, self.max = min, max
        bounds = [f">= {min}" if min is not None else "", f"<= {max}" if max is not None else ""]
        qualifier = " and ".join(b for b in bounds if b)
        self.expected = f"a number {qualifier}".strip()

    def check(self, value, source, keypath):
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(value, source, keypath)
        if (self.min is not None and value < self.min) or (
            self.max is not None and value > self.max
        ):
            self.fail(value, source, keypath)
        return float(value)


class Choice(Kind):
    def __init__(self, *values: str):
        self.values = values
        self.expected = "one of " + ", ".join(repr(v) for v in values)

    def check(self, value, source, keypath):
        if value not in self.values:
            self.fail(value, source, keypath)
        return value


class IPv4Address(Kind):
    expected = "an IPv4 address such as '192.0.2.10'"

    def check(self, value, source, keypath):
        try:
            return (
                ipaddress.IPv4Address(value)
                if isinstance(value, str)
                else self.fail(value, source, keypath)
            )
        except ValueError:
            self.fail(value, source, keypath)

    def to_toml(self, value):
        return _toml_scalar(str(value))


class IPv4Network(Kind):
    expected = "an IPv4 network such as '192.0.2.0/24'"

    def check(self, value, source, keypath):
        try:
            return (
                ipaddress.IPv4Network(value)
                if isinstance(value, str)
                else self.fail(value, source, keypath)
            )
        except ValueError:
            self.fail(value, source, keypath)

    def to_toml(self, value):
        return _toml_scalar(str(value))


class IPv4Interface(Kind):
    """An address with its network's prefix length, as an interface carries it."""

    expected = "an IPv4 address with its prefix length such as '192.0.2.10/24'"

    def check(self, value, source, keypath):
        if not isinstance(value, str) or "/" not in value:
            self.fail(value, source, keypath)
        try:
            return ipaddress.IPv4Interface(value)
        except ValueError:
            self.fail(value, source, keypath)

    def to_toml(self, value):
        return _toml_scalar(str(value))


class List(Kind):
    def __init__(self, item: Kind, max_items: int = 4096):
        self.item = item
        self.max_items = max_items
        self.expected = f"a list of {item.expected.removeprefix('a ').removeprefix('an ')}"

    def check(self, value, source, keypath):
        if not isinstance(value, list) or len(value) > self.max_items:
            self.fail(value, source, keypath)
        return tuple(self.item.check(v, source, f"{keypath}[{i}]") for i, v in enumerate(value))

    def to_toml(self, value):
        return "[" + ", ".join(self.item.to_toml(v) for v in value) + "]"


@dataclass(frozen=True)
class Field:
    """One key of a section.

    ``default`` applies when the key is absent (``REQUIRED`` makes it
    mandatory, ``None`` makes it optional with no value). ``dev_default``
    replaces ``default`` for the standalone development node (loopback,
    unprivileged ports, data under the user's directory). Either may be a
    zero-argument callable evaluated at load time.
    """

    kind: Kind
    default: Any = REQUIRED
    doc: str = ""
    dev_default: Any = REQUIRED
    example: Any = None  # shown by `config example` when there is no default

    def resolve_default(self, dev: bool) -> Any:
        value = self.dev_default if dev and self.dev_default is not REQUIRED else self.default
        return value() if callable(value) else value


@dataclass(frozen=True)
class Table(Kind):
    """A nested table (a sub-section) with its own fields."""

    fields: Mapping[str, Field]
    doc: str = ""

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "a table"

    def check(self, value, source, keypath, dev: bool = False):
        if not isinstance(value, dict):
            self.fail(value, source, keypath)
        return validate_table(self.fields, value, source, keypath, dev)


@dataclass(frozen=True)
class TableList(Kind):
    """An array of tables (``[[section.key]]``), each with the given fields."""

    fields: Mapping[str, Field]
    doc: str = ""
    max_items: int = 1024

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "an array of tables"

    def check(self, value, source, keypath, dev: bool = False):
        if not isinstance(value, list) or len(value) > self.max_items:
            self.fail(value, source, keypath)
        out = []
        for i, item in enumerate(value):
            path = f"{keypath}[{i}]"
            if not isinstance(item, dict):
                self.fail(item, source, path, "a table")
            out.append(validate_table(self.fields, item, source, path, dev))
        return tuple(out)


@dataclass(frozen=True)
class Listener:
    """Where a section's service listens, named by keys of the section, so that the
    core refuses two services on one address and port before anything starts, and
    names the address when a bind fails."""

    protocol: str  # "udp" or "tcp": the two never clash with each other
    port: str  # the key of the port (0: an ephemeral port, never a clash)
    # The key of an address or a list of them ('0.0.0.0': every address); "" for a
    # service that always binds every address (per interface, say).
    addresses: str = ""
    enabled: str = ""  # the key that turns the service off (false or 'off'), if any
    offset: int = 0  # listens on the port's value plus this (replication: the election's + 1)
    # Whether the settings make the service listen at all (the election binds only
    # with peers or witnesses); None: whenever it is enabled.
    when: Callable[[Settings], bool] | None = None


@dataclass(frozen=True)
class Section:
    """A plugin's top-level configuration section, ``[name]``."""

    name: str
    fields: Mapping[str, Field]
    doc: str = ""
    owner: str = field(default="", compare=False)  # plugin name, filled in by the core
    listeners: tuple[Listener, ...] = ()


class Settings(Mapping[str, Any]):
    """A validated, read-only table: ``cfg.port`` or ``cfg["port"]``."""

    __slots__ = ("_values", "_path")

    def __init__(self, values: dict[str, Any], path: str = "") -> None:
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_path", path)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(f"configuration has no key {self._path}{key}") from None

    def __setattr__(self, key, value):
        raise AttributeError("configuration is read-only")

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Settings({self._values!r})"

    def to_plain(self) -> dict[str, Any]:
        """JSON-friendly copy (addresses and networks as strings)."""
        return {k: _plain(v) for k, v in self._values.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Settings):
        return value.to_plain()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv4Network | ipaddress.IPv4Interface):
        return str(value)
    return value


def validate_table(
    fields: Mapping[str, Field], raw: Mapping[str, Any], source: str, keypath: str, dev: bool
) -> Settings:
    prefix = f"{keypath}." if keypath else ""
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise ConfigError(
            source, prefix + unknown[0], f"a known key (known here: {known})", has_found=False
        )
    values: dict[str, Any] = {}
    for name, spec in fields.items():
        path = prefix + name
        if name in raw:
            if isinstance(spec.kind, Table | TableList):
                values[name] = spec.kind.check(raw[name], source, path, dev)
            else:
                values[name] = spec.kind.check(raw[name], source, path)
            continue
        default = spec.resolve_default(dev)
        if default is REQUIRED:
            raise ConfigError(
                source, path, spec.kind.expected + " (this key is required)", has_found=False
            )
        if isinstance(spec.kind, Table | TableList) and isinstance(default, dict | list):
            default = spec.kind.check(default, source, path, dev)
        values[name] = default
    return Settings(values, prefix)


def _toml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_scalar(v) for v in value) + "]"
    return _toml_scalar(str(value))


def render_example(sections: list[Section]) -> str:
    """A complete, commented TOML configuration built from the schemas.

    Keys with a default or an example are written out so the result is valid
    as is; optional keys with neither are shown commented out.
    """
    lines = [
        "# Rackboot configuration (TOML). Generated by `rackboot config example`.",
        "# Every key is shown with its default; edit what your rack needs.",
    ]
    for section in sections:
        lines.append("")
        if section.doc:
            lines.extend(f"# {line}".rstrip() for line in section.doc.splitlines())
        if section.owner:
            lines.append(f"# (declared by plugin {section.owner!r})")
        lines.extend(_render_table(section.name, section.fields, array=False))
    return "\n".join(lines) + "\n"


def _render_table(header: str, fields: Mapping[str, Field], *, array: bool) -> list[str]:
    lines = [f"[[{header}]]" if array else f"[{header}]"]
    nested: list[tuple[str, Field]] = []
    for name, spec in fields.items():
        if isinstance(spec.kind, Table | TableList):
            nested.append((name, spec))
            continue
        if spec.doc:
            lines.extend(f"# {line}".rstrip() for line in spec.doc.splitlines())
        value = spec.example if spec.example is not None else spec.resolve_default(dev=False)
        if value is REQUIRED or value is None:
            lines.append(f"# {name} = <{spec.kind.expected}>")
        else:
            lines.append(f"{name} = {spec.kind.to_toml(value)}")
    for name, spec in nested:
        lines.append("")
        if spec.doc:
            lines.extend(f"# {line}".rstrip() for line in spec.doc.splitlines())
        array = isinstance(spec.kind, TableList)
        lines.extend(_render_table(f"{header}.{name}", spec.kind.fields, array=array))  # type: ignore[attr-defined]
    return lines
