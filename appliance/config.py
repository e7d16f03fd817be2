"""Loading and validating the configuration file.

Reading happens in two passes: the ``[plugins]`` section first (it decides
which plugins load), then the whole document against every loaded plugin's
declared :class:`~appliance.schema.Section`.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
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
    """The machine's host name, up to its first dot."""
    return socket.gethostname().split(".")[0] or "rackboot"


@dataclass(frozen=True)
class Listening:
    """One address and port a service of this node will listen on (a :class:`Listener`
    resolved against the settings)."""

    protocol: str
    address: str
    port: int
    keypath: str  # the port's key, "tftp.port"
    addresses_keypath: str  # "tftp.addresses"
    owner: str  # the plugin that declared it

    def overlaps(self, other: Listening) -> bool:
        same_port = (self.protocol, self.port) == (other.protocol, other.port)
        return same_port and (
            self.address == other.address or WILDCARD in (self.address, other.address)
        )

    def __str__(self) -> str:
        return f"{self.address}:{self.port}"


WILDCARD = "0.0.0.0"


@dataclass(frozen=True)
class Config:
    """The validated configuration: one :class:`Settings` per section."""

    source: str  # file path, "<stdin>" or "<defaults>"
    dev: bool
    sections: dict[str, Settings]
    raw: dict[str, Any]
    listening: tuple[Listening, ...] = ()  # what the sections' services will bind

    def __getitem__(self, name: str) -> Settings:
        return self.sections[name]

    def __getattr__(self, name: str) -> Settings:
        try:
            return self.sections[name]
        except KeyError:
            raise AttributeError(f"no configuration section [{name}]") from None

    @property
    def sets_nothing(self) -> bool:
        """A file that sets nothing (empty, or comments only): every default applies.
        Valid TOML, so accepted, but said aloud: a truncated file looks the same."""
        return not self.raw and self.source != "<defaults>"

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
        data = _read_regular_file(source)
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


# Why a configuration path could not be opened, as the operator should read it.
_OPEN_FAILURES = {
    errno.ENOENT: "an existing configuration file",
    errno.ENOTDIR: "an existing configuration file (a component of the path is not a directory)",
    errno.ELOOP: "an existing configuration file (the path is a symbolic link loop)",
    errno.ENAMETOOLONG: "a path whose components are at most 255 bytes (a name is too long)",
    errno.EACCES: "a readable file (permission denied)",
    errno.EPERM: "a readable file (permission denied)",
}


def _read_regular_file(source: str) -> bytes:
    """The file's bytes, refusing anything but a regular file *before* reading it:
    a FIFO without a writer would block for ever, a device would never end.
    O_NONBLOCK keeps even the open from waiting on a FIFO swapped in after a stat."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        if isinstance(exc, IsADirectoryError):
            raise ConfigError(source, "", "a file, not a directory", has_found=False) from None
        expected = _OPEN_FAILURES.get(exc.errno, f"a readable file ({exc.strerror})")
        raise ConfigError(source, "", expected, has_found=False) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(source, "", "a file, not a directory", has_found=False)
        if not stat.S_ISREG(mode):
            raise ConfigError(
                source, "", f"a regular file, not a {_file_kind(mode)}", has_found=False
            )
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as fh:
            fd = -1  # the file object owns it now
            return fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            source, "", f"a readable file ({exc.strerror})", has_found=False
        ) from None
    finally:
        if fd >= 0:
            os.close(fd)


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "named pipe (FIFO)"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


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
    listening = resolve_listeners(sections, result)
    check_listeners(source, listening)
    return Config(source, dev, result, document, tuple(listening))


def resolve_listeners(sections: list[Section], settings: dict[str, Settings]) -> list[Listening]:
    """Every address and port the enabled services declare they will bind."""
    found = []
    for section in sections:
        values = settings.get(section.name)
        for listener in section.listeners if values is not None else ():
            port = values[listener.port]
            if (
                (listener.enabled and values[listener.enabled] in (False, "off"))
                or (listener.when is not None and not listener.when(values))
                or port == 0
            ):
                continue
            addresses = values[listener.addresses] if listener.addresses else WILDCARD
            for address in addresses if isinstance(addresses, list | tuple) else [addresses]:
                found.append(
                    Listening(
                        listener.protocol, str(address), port + listener.offset,
                        f"{section.name}.{listener.port}" + (
                            f" + {listener.offset}" if listener.offset else ""
                        ),
                        f"{section.name}.{listener.addresses}", section.owner,
                    )
                )  # fmt: skip
    return found


def check_listeners(source: str, listening: list[Listening]) -> None:
    """Two services (or one twice) on one protocol, address and port: the second bind
    would fail at start-up, after the others started; refused here, before any does."""
    for i, later in enumerate(listening):
        for earlier in listening[:i]:
            if not later.overlaps(earlier):
                continue
            if later.keypath == earlier.keypath:  # one listener, overlapping addresses
                raise ConfigError(
                    source, later.addresses_keypath,
                    f"addresses that do not overlap ({earlier.address} and {later.address} "
                    f"on {later.protocol.upper()} port {later.port}; '{WILDCARD}' covers every address)",
                    has_found=False,
                )  # fmt: skip
            raise ConfigError(
                source, later.keypath,
                f"a {later.protocol.upper()} port that no other listener of this node uses "
                f"on {later.address} ({earlier.keypath} listens on {earlier} too)",
                later.port,
            )  # fmt: skip
