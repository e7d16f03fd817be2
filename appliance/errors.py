"""Errors the CLI turns into one clear message and a documented exit code."""

from __future__ import annotations

# Exit codes (documented in docs/cli.md).
EXIT_OK = 0
EXIT_FAILURE = 1  # the node failed while running
EXIT_CONFIG = 2  # usage or configuration error
EXIT_PLUGIN = 3  # a plugin failed to load, register, configure or start
EXIT_UNREACHABLE = 4  # no node answers on the control socket
EXIT_ALREADY_RUNNING = 5  # another node holds the data directory


class RackbootError(Exception):
    """Base of errors that carry their own exit code and operator-facing message."""

    exit_code = EXIT_FAILURE


class ConfigError(RackbootError):
    """A configuration problem, naming the file, the key path and the expectation."""

    exit_code = EXIT_CONFIG

    def __init__(
        self, source: str, keypath: str, expected: str, found: object = None, *, has_found=True
    ) -> None:
        self.source = source
        self.keypath = keypath
        self.expected = expected
        self.found = found
        where = f"{source}: {keypath}" if keypath else source
        msg = f"{where}: expected {expected}"
        if has_found:
            msg += f", found {describe_value(found)}"
        super().__init__(msg)


class PluginError(RackbootError):
    """A plugin that failed to import, register, configure or start, named."""

    exit_code = EXIT_PLUGIN


class AlreadyRunning(RackbootError):
    exit_code = EXIT_ALREADY_RUNNING


class Unreachable(RackbootError):
    exit_code = EXIT_UNREACHABLE


def describe_value(value: object) -> str:
    """A short, type-revealing rendering of a config value for error messages."""
    if value is None:
        return "nothing"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
