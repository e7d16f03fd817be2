"""The ``[redfish]`` configuration section (docs/power.md) and the BMCs it declares.

Safe by default: no BMC, so the plugin sends nothing. Each ``[[redfish.bmcs]]`` names a
BMC by ``HOST:PORT`` with its user and a file holding the password (never the password
itself, so that the configuration can be shown and shared); its TLS certificate is
verified, against the system's CAs or ``ca_file``; plain HTTP only where allowed.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Any

from appliance.api import Bool, Field, Float, Section, Str
from appliance.errors import ConfigError
from appliance.schema import Kind, validate_table

from .redfish_core import bmc_key

PASSWORD_FILE_CAP = 4096

BMC_FIELDS = {
    "address": Field(
        Str(r"[^\s/@]{1,260}", "'HOST:PORT' of the BMC"),
        doc="The BMC, as machines' power addresses name it: HOST:PORT (the port is required).",
    ),  # fmt: skip
    "username": Field(
        Str(r"[^\s:]{1,64}", "a user name (no spaces or ':')"),
        doc="The BMC user the appliance logs in as (HTTP basic authentication).",
    ),  # fmt: skip
    "password_file": Field(
        Str(r"/\S{1,4000}", "an absolute file path"),
        doc="A file holding the user's password on its first line (readable by the appliance).",
    ),  # fmt: skip
    "verify_tls": Field(
        Bool(),
        default=True,
        doc="Verify the BMC's certificate and name. Off only for a BMC whose network "
        "nobody else reaches: without it, anyone in between learns the password.",
    ),  # fmt: skip
    "ca_file": Field(
        Str(r"(/\S{1,4000})?", "an absolute file path or ''"),
        default="",
        doc="PEM file of the CA(s) that signed the BMC's certificate ('': the system's CAs).",
    ),  # fmt: skip
    "plain_http": Field(
        Bool(),
        default=False,
        doc="Allow 'redfish+http://' addresses to this BMC (an emulator): the password "
        "crosses the network in clear.",
    ),  # fmt: skip
}


class BmcList(Kind):
    """``[[redfish.bmcs]]`` tables. Not a TableList, whose example `rackboot config example`
    writes out as a table with example values: here it shows ``bmcs = []``, the safe
    default, instead of a BMC whose password file does not exist (the example must pass
    `rackboot config check`)."""

    expected = "an array of tables"
    max_items = 4096

    def check(self, value, source, keypath):
        if not isinstance(value, list) or len(value) > self.max_items:
            self.fail(value, source, keypath)
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                self.fail(item, source, f"{keypath}[{i}]", "a table")
            out.append(validate_table(BMC_FIELDS, item, source, f"{keypath}[{i}]", dev=False))
        return tuple(out)


SECTION = Section(
    "redfish",
    doc="Power control of servers through their BMCs' Redfish API (docs/power.md). "
    "No BMC by default: the plugin sends nothing.",
    fields={
        "timeout": Field(
            Float(min=0.5, max=60.0),
            default=10.0,
            doc="Seconds a power action may take with its BMC (connect, read the system, reset).",
        ),  # fmt: skip
        "bmcs": Field(
            BmcList(),
            default=(),
            doc="One [[redfish.bmcs]] table per BMC the appliance may power machines through: "
            "address = 'HOST:PORT', username, password_file, and optionally verify_tls, "
            "ca_file, plain_http (docs/power.md).",
        ),  # fmt: skip
    },
)


@dataclass(frozen=True)
class Bmc:
    address: str  # HOST:PORT, as Target.bmc spells it
    username: str
    password: str = field(repr=False)  # never in a log line
    tls: ssl.SSLContext
    plain_http: bool


def bmcs(settings: Any, source: str) -> dict[str, Bmc]:
    """The BMCs of ``[redfish]`` by ``HOST:PORT``, each password read from its file and
    TLS context made; ConfigError naming the key for a bad address, one given twice, a
    password file that cannot be read or a CA file that holds no certificate."""
    out: dict[str, Bmc] = {}
    for i, entry in enumerate(settings.bmcs):
        path = f"redfish.bmcs[{i}]"
        key = bmc_key(entry.address)
        if key is None:
            raise ConfigError(source, f"{path}.address",
                              "'HOST:PORT' (a host name, IPv4 or [IPv6] address, and a port)",
                              entry.address)  # fmt: skip
        if key in out:
            raise ConfigError(source, f"{path}.address", "each BMC once", entry.address)
        password = _password(entry.password_file, source, f"{path}.password_file")
        tls = _tls_context(entry, source, path)
        out[key] = Bmc(key, entry.username, password, tls, entry.plain_http)
    return out


def _password(file: str, source: str, keypath: str) -> str:
    expected = "a readable file holding the password on its first line"
    try:
        with open(file, "rb") as f:
            data = f.read(PASSWORD_FILE_CAP + 1)
    except OSError as exc:
        raise ConfigError(source, keypath, f"{expected} ({os.strerror(exc.errno or 0)})",
                          file) from None  # fmt: skip
    if len(data) > PASSWORD_FILE_CAP:
        raise ConfigError(source, keypath, f"{expected}, of at most {PASSWORD_FILE_CAP} bytes",
                          file)  # fmt: skip
    try:
        password = data.decode("utf-8").partition("\n")[0].removesuffix("\r")
    except UnicodeDecodeError:
        raise ConfigError(source, keypath, f"{expected}, in UTF-8", file) from None
    if not password:
        raise ConfigError(source, keypath, f"{expected} (its first line is empty)", file)
    return password


def _tls_context(entry: Any, source: str, path: str) -> ssl.SSLContext:
    if not entry.verify_tls:
        if entry.ca_file:  # a CA that nothing checks against: the operator meant to verify
            raise ConfigError(source, f"{path}.ca_file", "'' when verify_tls is false",
                              entry.ca_file)  # fmt: skip
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=entry.ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(source, f"{path}.ca_file",
                          f"a readable PEM file of CA certificates ({exc})", entry.ca_file) from None  # fmt: skip
