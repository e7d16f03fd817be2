"""The Redfish power plugin's decisions, without I/O (docs/power.md).

A machine's address (``redfish://HOST[:PORT]/redfish/v1/Systems/ID``) becomes a
:class:`Target`; the BMC's ComputerSystem resource, untrusted bytes, becomes a
:class:`System`; an action and the system's ``PowerState`` become the ``ResetType`` to
post to its ``ComputerSystem.Reset`` action, or none when the machine is already there.
The shell (plugins/power/redfish_client.py) sends the requests.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from .address import split_address

# https on 443 by default; redfish+http (plain, for emulators) on 80, allowed per BMC only.
SCHEMES = {"redfish": (True, 443), "redfish+http": (False, 80)}
SYSTEM_PATH = re.compile(r"/redfish/v1/Systems/[A-Za-z0-9._~%:@!$&'()*+,;=-]{1,128}")
HOST = re.compile(r"[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]")
# A reset target the BMC names: a path on the same BMC, under the Redfish root.
RESET_PATH = re.compile(r"/redfish/v1/[A-Za-z0-9._~%:@!$&'()*+,;=/-]{1,400}")
REPLY_CAP = 256 * 1024  # a ComputerSystem resource is a few KiB; an error reply less
MESSAGE_CAP = 200  # characters of a BMC's error message kept for the log

ACTIONS = ("on", "off", "cycle")
# Reset types in order of preference, per what the action needs from the current state.
POWER_ON = ("On", "ForceOn")
POWER_OFF = ("ForceOff",)
RESTART = ("ForceRestart", "PowerCycle")
ON_STATES = ("On", "PoweringOn")
OFF_STATES = ("Off", "PoweringOff")


class AddressError(ValueError):
    """A ``redfish`` power address this plugin cannot use (the message says why)."""


class ReplyError(ValueError):
    """A BMC reply that is not what Redfish promises (the message says why)."""


class PlanError(ValueError):
    """No reset type the system allows takes the action."""


@dataclass(frozen=True)
class Target:
    tls: bool
    host: str  # lower case; an IPv6 address in brackets
    port: int
    path: str  # /redfish/v1/Systems/ID

    @property
    def bmc(self) -> str:
        """The ``[[redfish.bmcs]] address`` whose credentials it takes: ``HOST:PORT``."""
        return f"{self.host}:{self.port}"

    @property
    def connect_host(self) -> str:
        return self.host.strip("[]")


@dataclass(frozen=True)
class System:
    power_state: str | None  # None: the BMC does not say
    reset_target: str  # the path to post a ResetType to
    allowed: tuple[str, ...] | None  # None: the BMC lists no allowable values


def target_of(power: str) -> Target | None:
    """The BMC and system of a machine's power address; None when the address is not a
    Redfish one (another plugin's). AddressError when it is, but malformed."""
    scheme, _ = split_address(power)
    if scheme not in SCHEMES:
        return None
    tls, default_port = SCHEMES[scheme]
    try:
        parts = urlsplit(power)
        port = parts.port if parts.port is not None else default_port
    except ValueError as exc:
        raise AddressError(f"not a URL with a valid port: {exc}") from None
    if port == 0:
        raise AddressError("not a URL with a valid port: 0")
    if parts.username is not None or parts.password is not None:
        raise AddressError("credentials belong in [[redfish.bmcs]], not in the address")
    if parts.query or parts.fragment:
        raise AddressError("no query or fragment expected")
    host = _host_of(parts.netloc)
    if host is None:
        raise AddressError("expected a host name or address after '//'")
    path = parts.path.rstrip("/")
    if not SYSTEM_PATH.fullmatch(path):
        raise AddressError("expected the path /redfish/v1/Systems/ID")
    return Target(tls, host, port, path)


def bmc_key(address: str) -> str | None:
    """``HOST:PORT`` as :attr:`Target.bmc` spells it, or None if ``address`` is not one."""
    try:
        parts = urlsplit("//" + address)
        port = parts.port
    except ValueError:
        return None
    host = _host_of(parts.netloc)
    if host is None or not port or parts.path or parts.username is not None:
        return None
    return f"{host}:{port}"


def _host_of(netloc: str) -> str | None:
    host = netloc.rpartition("@")[2]  # "[IPv6]:PORT" or "NAME:PORT", the port optional
    host = host[: host.find("]") + 1] if host.startswith("[") else host.partition(":")[0]
    return host.lower() if HOST.fullmatch(host) else None


def system_untrusted(body: bytes, path: str) -> System:
    """A ComputerSystem resource (JSON) from the BMC at ``path``: its ``PowerState``, the
    target of its ``#ComputerSystem.Reset`` action (by default ``PATH/Actions/...``, as
    the schema names it) and the reset types it allows. ReplyError otherwise."""
    document = _json_untrusted(body)
    state = document.get("PowerState")
    if state is not None and not (isinstance(state, str) and state.isalnum() and len(state) <= 32):
        raise ReplyError("PowerState is not a short word")
    actions = document.get("Actions", {})
    reset = actions.get("#ComputerSystem.Reset") if isinstance(actions, dict) else None
    if reset is None:
        # Every ComputerSystem that can be powered has the action; without it, no reset.
        raise ReplyError("the system has no #ComputerSystem.Reset action")
    if not isinstance(reset, dict):
        raise ReplyError("#ComputerSystem.Reset is not an object")
    target = reset.get("target", f"{path}/Actions/ComputerSystem.Reset")
    if not isinstance(target, str) or not RESET_PATH.fullmatch(target) or ".." in target:
        raise ReplyError("the reset target is not a path under /redfish/v1/")
    allowed = reset.get("ResetType@Redfish.AllowableValues")
    if allowed is not None:
        if not isinstance(allowed, list) or len(allowed) > 32:
            raise ReplyError("ResetType@Redfish.AllowableValues is not a short list")
        if not all(isinstance(v, str) and v.isalnum() and len(v) <= 32 for v in allowed):
            raise ReplyError("ResetType@Redfish.AllowableValues holds other than words")
        allowed = tuple(allowed)
    return System(state, target, allowed)


def error_message_untrusted(body: bytes) -> str:
    """What a Redfish error reply says (its first extended message, else its message), in
    at most MESSAGE_CAP printable characters; '' when it says nothing readable."""
    try:
        document = _json_untrusted(body)
    except ReplyError:
        return ""
    error = document.get("error")
    if not isinstance(error, dict):
        return ""
    text = error.get("message")
    extended = error.get("@Message.ExtendedInfo")
    if isinstance(extended, list) and extended and isinstance(extended[0], dict):
        text = extended[0].get("Message", text)
    if not isinstance(text, str):
        return ""
    return "".join(c if c.isprintable() else "?" for c in text[:MESSAGE_CAP])


def _json_untrusted(body: bytes) -> dict:
    if len(body) > REPLY_CAP:
        raise ReplyError(f"a reply of more than {REPLY_CAP} bytes")
    try:
        document = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ReplyError("not JSON") from None
    if not isinstance(document, dict):
        raise ReplyError("not a JSON object")
    return document


def reset_type(action: str, system: System) -> str | None:
    """The ResetType that takes ``action`` from the system's PowerState, or None when it
    is already there (``on`` of a machine on, ``off`` of one off). ``cycle`` of a machine
    that is off powers it on: a restart of a machine off is refused or ignored by many
    BMCs. PlanError when the system allows none of the types that would do."""
    state = system.power_state
    wanted: tuple[str, ...]
    if action == "on":
        if state in ON_STATES:
            return None
        wanted = POWER_ON
    elif action == "off":
        if state == "Off":
            return None
        wanted = POWER_OFF
    elif action == "cycle":
        wanted = POWER_ON if state in OFF_STATES else RESTART
    else:
        raise PlanError(f"unknown action {action!r} (expected one of {', '.join(ACTIONS)})")
    if system.allowed is None:
        return wanted[0]  # the BMC lists nothing: the first choice is the schema's usual
    for candidate in wanted:
        if candidate in system.allowed:
            return candidate
    raise PlanError(f"the system allows none of {', '.join(wanted)} "
                    f"(it allows {', '.join(system.allowed) or 'nothing'})")  # fmt: skip


def reset_body(reset: str) -> bytes:
    return json.dumps({"ResetType": reset}).encode()
