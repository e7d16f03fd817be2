"""Loading and validating the configuration file.

Reading happens in two passes: the ``[plugins]`` section first (it decides
which plugins load), then the whole document against every loaded plugin's
declared :class:`~appliance.schema.Section`.
"""

from __future__ import annotations

import os
import socket
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.errors import ConfigError
from appliance.schema import Section, Settings, validate_table

DEFAULT_CONFIG_PATH = Path("/etc/rackboot/rackboot.toml")
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def dev_data_dir() -> str:
    """Where the standalone development node keeps its state: the user's data directory."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return os.path.join(base, "rackboot")


def default_node_name() -> str:
    return socket.gethostname().split(".")[0] or "rackboot"


@dataclass(frozen=True)
class Config:
    """The validated configuration: one :class:`Settings` per section."""

    source: str  # file path, "<stdin>" or "<defaults>"
    dev: bool
    sections: dict[str, Settings]
    raw: dict[str, Any]

    def __getitem__(self, name: str) -> Settings:
        return self.sections[name]

    def __getattr__(self, name: str) -> Settings:
        try:
            return self.sections[name]
        except KeyError:
            raise AttributeError(f"no configuration section [{name}]") from None

    def to_plain(self) -> dict[str, Any]:
        return {name: settings.to_plain() for name, settings in self.sections.items()}


def read_document(path: str | os.PathLike | None) -> tuple[str, dict[str, Any]]:
    """Read and parse a TOML document; ``'-'`` reads standard input.

    Returns ``(source, document)``. Errors name the file and the TOML problem.
    """
    if path == "-":
        data = sys.stdin.buffer.read(MAX_CONFIG_BYTES + 1)
        source = "<stdin>"
    else:
        source = os.fspath(path)  # type: ignore[arg-type]
        try:
            with open(source, "rb") as fh:
                data = fh.read(MAX_CONFIG_BYTES + 1)
        except FileNotFoundError:
            raise ConfigError(
                source, "", "an existing configuration file", has_found=False
            ) from None
        except IsADirectoryError:
            raise ConfigError(source, "", "a file, not a directory", has_found=False) from None
        except PermissionError:
            raise ConfigError(
                source, "", "a readable file (permission denied)", has_found=False
            ) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(source, "", f"at most {MAX_CONFIG_BYTES} bytes", has_found=False)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source, "", f"UTF-8 text (bad byte at offset {exc.start})", has_found=False
        ) from None
    try:
        return source, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "", f"valid TOML ({exc})", has_found=False) from None


def disabled_plugins(source: str, document: dict[str, Any]) -> tuple[str, ...]:
    """The ``plugins.disabled`` list, checked before any plugin is loaded."""
    plugins = document.get("plugins", {})
    if not isinstance(plugins, dict):
        raise ConfigError(source, "plugins", "a table", plugins)
    disabled = plugins.get("disabled", [])
    if not isinstance(disabled, list) or not all(isinstance(n, str) for n in disabled):
        raise ConfigError(source, "plugins.disabled", "a list of plugin names", disabled)
    return tuple(disabled)


def validate(
    source: str,
    document: dict[str, Any],
    sections: list[Section],
    *,
    dev: bool,
    ignored_sections: frozenset[str] = frozenset(),
) -> Config:
    """Validate ``document`` against ``sections``; sections of disabled plugins are ignored."""
    by_name = {s.name: s for s in sections}
    for name, _value in document.items():
        if name in by_name or name in ignored_sections:
            continue
        known = ", ".join(sorted(by_name))
        raise ConfigError(source, name, f"a known section (known: {known})", has_found=False)
    result: dict[str, Settings] = {}
    for section in sections:
        raw = document.get(section.name, {})
        if not isinstance(raw, dict):
            raise ConfigError(source, section.name, "a table", raw)
        result[section.name] = validate_table(section.fields, raw, source, section.name, dev)
    return Config(source=source, dev=dev, sections=result, raw=document)
