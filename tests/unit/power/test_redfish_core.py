"""The Redfish plugin's decisions without I/O: addresses, untrusted replies, reset types."""

from __future__ import annotations

import json

import pytest

from plugins.power.address import split_address
from plugins.power.redfish_core import (
    REPLY_CAP,
    AddressError,
    PlanError,
    ReplyError,
    System,
    Target,
    bmc_key,
    error_message_untrusted,
    reset_body,
    reset_type,
    system_untrusted,
    target_of,
)

PATH = "/redfish/v1/Systems/1"


def test_split_address():
    assert split_address("Redfish://bmc/x") == ("redfish", "//bmc/x")
    assert split_address("qemu:web1") == ("qemu", "web1")
    assert split_address("") == ("", "")
    assert split_address(":x") == ("", "")
    assert split_address("noscheme") == ("", "")


@pytest.mark.parametrize(
    ("power", "target"),
    [
        ("redfish://BMC7.rack:8443/redfish/v1/Systems/1", Target(True, "bmc7.rack", 8443, PATH)),
        ("redfish://10.0.0.5/redfish/v1/Systems/1/", Target(True, "10.0.0.5", 443, PATH)),
        ("REDFISH+HTTP://127.0.0.1:8000" + PATH, Target(False, "127.0.0.1", 8000, PATH)),
        ("redfish://[FE80::1]:443" + PATH, Target(True, "[fe80::1]", 443, PATH)),
        ("redfish+http://h/redfish/v1/Systems/a-b_c.d", Target(False, "h", 80, "/redfish/v1/Systems/a-b_c.d")),
    ],
)  # fmt: skip
def test_redfish_addresses(power, target):
    assert target_of(power) == target


def test_target_names_its_bmc_as_the_config_does():
    assert target_of("redfish://BMC:8443" + PATH).bmc == bmc_key("bmc:8443") == "bmc:8443"
    assert target_of("redfish://[::1]:8443" + PATH).bmc == bmc_key("[::1]:8443") == "[::1]:8443"
    assert target_of("redfish://[::1]:8443" + PATH).connect_host == "::1"
    assert bmc_key("bmc") is None  # the port is required
    assert bmc_key("bmc:99999") is None
    assert bmc_key("bmc:0") is None
    assert bmc_key("user@bmc:443") is None
    assert bmc_key("bmc:443/x") is None


@pytest.mark.parametrize("power", ["qemu:web1", "", "ipmi://bmc/1", "redfishy://x"])
def test_other_schemes_are_not_ours(power):
    assert target_of(power) is None


@pytest.mark.parametrize(
    ("power", "why"),
    [
        ("redfish://bmc:99999" + PATH, "port"),
        ("redfish://bmc:0" + PATH, "port"),
        ("redfish://root:pw@bmc" + PATH, "credentials"),
        ("redfish://bmc/redfish/v1/Systems", "/redfish/v1/Systems/ID"),
        ("redfish://bmc/redfish/v1/Systems/1/Bios", "/redfish/v1/Systems/ID"),
        ("redfish://bmc/redfish/v1/Chassis/1", "/redfish/v1/Systems/ID"),
        ("redfish://bmc" + PATH + "?x=1", "query"),
        ("redfish:///redfish/v1/Systems/1", "host"),
        ("redfish://bm_c" + PATH, "host"),
    ],
)
def test_malformed_redfish_addresses(power, why):
    with pytest.raises(AddressError, match=why.replace("?", r"\?")):
        target_of(power)


def system_json(**overrides) -> bytes:
    doc = {
        "@odata.id": PATH,
        "PowerState": "Off",
        "Actions": {
            "#ComputerSystem.Reset": {
                "target": PATH + "/Actions/ComputerSystem.Reset",
                "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "ForceRestart"],
            }
        },
    }
    doc.update(overrides)
    return json.dumps(doc).encode()


def test_system_untrusted_reads_state_target_and_allowed():
    assert system_untrusted(system_json(), PATH) == System(
        "Off", PATH + "/Actions/ComputerSystem.Reset", ("On", "ForceOff", "ForceRestart")
    )


def test_system_untrusted_defaults():
    """No PowerState: unknown; no target: the schema's; no allowable values: None."""
    body = system_json(Actions={"#ComputerSystem.Reset": {}})
    doc = json.loads(body)
    del doc["PowerState"]
    assert system_untrusted(json.dumps(doc).encode(), PATH) == System(
        None, PATH + "/Actions/ComputerSystem.Reset", None
    )


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\xff", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b"[" * 100_000, "not JSON"),  # nesting deep enough to recurse out
        (b" " * (REPLY_CAP + 1), "more than"),
        (system_json(PowerState="On; rm -rf"), "PowerState"),
        (system_json(PowerState=["On"]), "PowerState"),
        (system_json(Actions={}), "no #ComputerSystem.Reset"),
        (system_json(Actions=[]), "no #ComputerSystem.Reset"),
        (system_json(Actions={"#ComputerSystem.Reset": "x"}), "not an object"),
        (system_json(Actions={"#ComputerSystem.Reset": {"target": "http://evil/x"}}), "target"),
        (system_json(Actions={"#ComputerSystem.Reset": {"target": "/redfish/v1/../../etc"}}), "target"),
        (system_json(Actions={"#ComputerSystem.Reset": {"target": "/other/Reset"}}), "target"),
        (system_json(Actions={"#ComputerSystem.Reset": {"ResetType@Redfish.AllowableValues": "On"}}), "short list"),
        (system_json(Actions={"#ComputerSystem.Reset": {"ResetType@Redfish.AllowableValues": ["On x"]}}), "words"),
    ],
)  # fmt: skip
def test_system_untrusted_refuses(body, why):
    with pytest.raises(ReplyError, match=why):
        system_untrusted(body, PATH)


def test_error_message_untrusted():
    extended = {"error": {"code": "Base.1.0.GeneralError", "message": "general",
                          "@Message.ExtendedInfo": [{"Message": "Bad ResetType\x1b[31m"}]}}  # fmt: skip
    assert error_message_untrusted(json.dumps(extended).encode()) == "Bad ResetType?[31m"
    assert error_message_untrusted(b'{"error": {"message": "' + b"x" * 500 + b'"}}') == "x" * 200
    assert error_message_untrusted(b"<html>Unauthorized</html>") == ""
    assert error_message_untrusted(b'{"error": "x"}') == ""
    assert error_message_untrusted(b"") == ""


ALL = ("On", "ForceOn", "ForceOff", "GracefulShutdown", "ForceRestart", "PowerCycle", "Nmi")


@pytest.mark.parametrize(
    ("action", "state", "allowed", "reset"),
    [
        ("on", "Off", ALL, "On"),
        ("on", None, ALL, "On"),  # a BMC that does not say: ask anyway
        ("on", "PoweringOff", ALL, "On"),
        ("on", "On", ALL, None),  # already on: nothing sent
        ("on", "PoweringOn", ALL, None),
        ("on", "Off", ("ForceOn", "ForceOff"), "ForceOn"),
        ("off", "On", ALL, "ForceOff"),
        ("off", "PoweringOff", ALL, "ForceOff"),  # a graceful shutdown may hang: force it
        ("off", "Off", ALL, None),
        ("cycle", "On", ALL, "ForceRestart"),
        ("cycle", None, ALL, "ForceRestart"),
        ("cycle", "On", ("On", "ForceOff", "PowerCycle"), "PowerCycle"),
        ("cycle", "Off", ALL, "On"),  # a restart of a machine off: power it on instead
        ("cycle", "PoweringOff", ALL, "On"),
        ("on", "Off", None, "On"),  # no allowable values listed: the usual type
        ("off", "On", None, "ForceOff"),
        ("cycle", "On", None, "ForceRestart"),
    ],
)
def test_reset_type(action, state, allowed, reset):
    assert (
        reset_type(action, System(state, PATH + "/Actions/ComputerSystem.Reset", allowed)) == reset
    )


@pytest.mark.parametrize(
    ("action", "state", "allowed", "why"),
    [
        ("cycle", "On", ("On", "ForceOff", "GracefulRestart"), "none of ForceRestart, PowerCycle"),
        ("off", "On", ("On", "GracefulShutdown"), "none of ForceOff"),
        ("on", "Off", (), "allows nothing"),
        ("reboot", "On", ALL, "unknown action"),
    ],
)
def test_reset_type_refuses(action, state, allowed, why):
    with pytest.raises(PlanError, match=why):
        reset_type(action, System(state, PATH, allowed))


def test_reset_body():
    assert json.loads(reset_body("ForceRestart")) == {"ResetType": "ForceRestart"}
