"""Errors the CLI turns into one clear message and a documented exit code."""

from __future__ import annotations

import errno
import os

# Exit codes (documented in docs/cli.md).
EXIT_OK = 0
EXIT_FAILURE = 1  # the node failed while running
EXIT_CONFIG = 2  # usage or configuration error
EXIT_PLUGIN = 3  # a plugin failed to load, register, configure or start
EXIT_UNREACHABLE = 4  # no node answers on the control socket
EXIT_ALREADY_RUNNING = 5  # another node holds the data directory
EXIT_DOCTOR_WARN = 6  # `rackboot doctor`: a check warned, none failed
EXIT_DOCTOR_FAIL = 7  # `rackboot doctor`: a check failed
EXIT_LAB_UNAVAILABLE = 8  # `rackboot lab`: cannot run here (root, a program, leftovers)


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


class UsageError(RackbootError):
    """A command line the CLI refuses (argparse's own errors exit 2 the same way)."""

    exit_code = EXIT_CONFIG


class PluginError(RackbootError):
    """A plugin that failed to import, register, configure or start, named."""

    exit_code = EXIT_PLUGIN


class AlreadyRunning(RackbootError):
    exit_code = EXIT_ALREADY_RUNNING


class Unreachable(RackbootError):
    exit_code = EXIT_UNREACHABLE


class LabUnavailable(RackbootError):
    """``rackboot lab`` cannot run here: the text says what is missing and what to do."""

    exit_code = EXIT_LAB_UNAVAILABLE


def describe_value(value: object) -> str:
    """A short, type-revealing rendering of a config value for error messages."""
    if value is None:
        return "nothing"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


# Why a bind failed, as an operator reads it (the errno names are for searching).
_BIND_FAILURES = {
    errno.EADDRINUSE: "address already in use (EADDRINUSE: another program or service has it)",
    errno.EADDRNOTAVAIL: "address not available (EADDRNOTAVAIL: no interface of this machine "
    "has it)",
}
PRIVILEGED_PORT = "needs root or CAP_NET_BIND_SERVICE"


def describe_os_error(
    exc: OSError, address: str = "", port: int | None = None, keypath: str = ""
) -> str:
    """One line for an OSError met while starting: the file, or the address and port
    (the listener the core found failing, if any, and the key that sets it), and why."""
    if exc.filename is not None:  # a file or directory: open, mkdir, chmod...
        return f"{exc.filename}: {(exc.strerror or str(exc)).lower()}"
    name = errno.errorcode.get(exc.errno or 0, "")
    if not address and exc.strerror and exc.strerror != os.strerror(exc.errno or 0):
        return f"{exc.strerror} ({name})"  # the plugin said where itself
    where = f"{address}:{port}" if address and port is not None else ""
    where += f" ({keypath})" if where and keypath else ""
    where += ": " if where else ""
    if exc.errno in (errno.EACCES, errno.EPERM):
        if port is None:
            return f"permission denied (EACCES: a port below 1024 {PRIVILEGED_PORT})"
        return f"{where}port {port} {PRIVILEGED_PORT}"
    if exc.errno in _BIND_FAILURES:
        return where + _BIND_FAILURES[exc.errno]
    return where + (f"{exc.strerror} ({name})" if exc.strerror and name else str(exc))
