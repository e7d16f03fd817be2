"""``[redfish]``: its errors name file, key and expectation; no BMC by default; the hook
answers only for Redfish addresses and fails, logged, for a BMC it has no entry for."""

from __future__ import annotations

import ssl
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from appliance.config import validate
from appliance.errors import ConfigError
from plugins.power.redfish import RedfishPlugin
from plugins.power.redfish_config import SECTION
from plugins.provisioning.lifecycle import Record
from tests.support.logs import captured_logs


def configured(text: str, source: str = "/etc/rack.toml") -> RedfishPlugin:
    plugin = RedfishPlugin()
    plugin.rackboot_configure(validate(source, tomllib.loads(text), [SECTION], dev=False))
    return plugin


def bmc_toml(tmp_path: Path, extra: str = "", password: bytes | None = b"s3cret\nignored\n") -> str:
    secret = tmp_path / "bmc.password"
    if password is not None:
        secret.write_bytes(password)
    return (f"[[redfish.bmcs]]\naddress = 'BMC7:8443'\nusername = 'rackboot'\n"
            f"password_file = '{secret}'\n{extra}")  # fmt: skip


def test_no_bmc_by_default():
    plugin = configured("")
    assert plugin.bmcs == {} and plugin.timeout == 10.0


def test_a_bmc_with_its_password_from_the_first_line(tmp_path):
    plugin = configured(bmc_toml(tmp_path, password=b"s3cret\r\nignored\n"))
    bmc = plugin.bmcs["bmc7:8443"]
    assert (bmc.username, bmc.password, bmc.plain_http) == ("rackboot", "s3cret", False)
    assert bmc.tls.verify_mode == ssl.CERT_REQUIRED and bmc.tls.check_hostname
    assert "s3cret" not in repr(bmc)


def test_verify_tls_off_is_warned(tmp_path):
    with captured_logs() as logs:
        plugin = configured(bmc_toml(tmp_path, "verify_tls = false\n"))
    assert plugin.bmcs["bmc7:8443"].tls.verify_mode == ssl.CERT_NONE
    assert [(e["level"], e["bmc"]) for e in logs() if "not verified" in e["msg"]] == [
        ("warning", "bmc7:8443")
    ]


@pytest.mark.parametrize(
    ("extra", "password", "message"),
    [
        ("", None, "redfish.bmcs[0].password_file: expected a readable file holding the password on its first line (No such file or directory), found str"),
        ("", b"", "redfish.bmcs[0].password_file: expected a readable file holding the password on its first line (its first line is empty)"),
        ("", b"\nsecond", "(its first line is empty)"),
        ("", b"x" * 5000, "redfish.bmcs[0].password_file: expected a readable file holding the password on its first line, of at most 4096 bytes"),
        ("", b"\xff\xfe", "redfish.bmcs[0].password_file: expected a readable file holding the password on its first line, in UTF-8"),
        ("ca_file = '/nonexistent/ca.pem'\n", b"pw", "redfish.bmcs[0].ca_file: expected a readable PEM file of CA certificates"),
        ("verify_tls = false\nca_file = '/etc/ca.pem'\n", b"pw", "redfish.bmcs[0].ca_file: expected '' when verify_tls is false, found str '/etc/ca.pem'"),
        ("password = 'inline'\n", b"pw", "redfish.bmcs[0].password: expected a known key (known here: address, ca_file, password_file, plain_http, username, verify_tls)"),
    ],
)  # fmt: skip
def test_config_errors(tmp_path, extra, password, message):
    with pytest.raises(ConfigError) as caught:
        configured(bmc_toml(tmp_path, extra, password))
    assert str(caught.value).startswith("/etc/rack.toml: ")
    assert message in str(caught.value)


def test_a_bad_ca_file_is_an_error(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"redfish.bmcs\[0\].ca_file: expected a readable PEM"):
        configured(bmc_toml(tmp_path, f"ca_file = '{ca}'\n"))


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("bmc7", "redfish.bmcs[1].address: expected 'HOST:PORT' (a host name, IPv4 or [IPv6] address, and a port), found str 'bmc7'"),
        ("bmc7:8443", "redfish.bmcs[1].address: expected each BMC once, found str 'bmc7:8443'"),
        ("Bmc7:8443", "redfish.bmcs[1].address: expected each BMC once, found str 'Bmc7:8443'"),
        ("bmc7:http", "redfish.bmcs[1].address: expected 'HOST:PORT'"),
    ],
)  # fmt: skip
def test_address_errors(tmp_path, address, message):
    second = bmc_toml(tmp_path).replace("BMC7:8443", address)
    with pytest.raises(ConfigError) as caught:
        configured(bmc_toml(tmp_path) + second)
    assert message in str(caught.value)


def test_timeout_bounds():
    with pytest.raises(ConfigError, match="redfish.timeout: expected a number >= 0.5 and <= 60.0"):
        configured("[redfish]\ntimeout = 600\n")


def machine(power: str) -> Record:
    return Record(name="web1", macs=("52:54:00:12:34:56",), profile="debian", power=power)


def test_the_hook_leaves_other_machines_to_other_plugins():
    plugin = configured("")
    for power in ("", "qemu:web1", "ipmi://bmc/1"):
        assert plugin.provisioning_power(machine=machine(power), action="on") is None


@pytest.mark.parametrize(
    ("power", "action", "reason", "detail"),
    [
        ("redfish://bmc9:443/redfish/v1/Systems/1", "on", "unknown_bmc", "no [[redfish.bmcs]] entry with address = 'bmc9:443'"),
        ("redfish://bmc9/redfish/v1/Chassis/1", "on", "address", "power address: expected the path /redfish/v1/Systems/ID"),
        ("redfish://bmc9/redfish/v1/Systems/1", "reboot", "action", "unknown action 'reboot'"),
    ],
)  # fmt: skip
def test_the_hook_fails_without_sending_anything(power, action, reason, detail):
    """Nothing configured for the BMC (the default), a malformed address, an unknown
    action: False, before any connection, with a log line saying why, counted."""
    plugin = configured("")
    registry = CollectorRegistry()
    plugin.rackboot_services(SimpleNamespace(metrics=registry))  # the node's registry
    with captured_logs() as logs:
        assert plugin.provisioning_power(machine=machine(power), action=action) is False
    [line] = [e for e in logs() if e["msg"] == "power action failed"]
    assert (line["level"], line["machine"], line["reason"], line["detail"]) == (
        "error", "web1", reason, detail)  # fmt: skip
    assert registry.get_sample_value("rackboot_redfish_failures_total", {"reason": reason}) == 1
    failed = {"action": action, "result": "failed"}
    assert registry.get_sample_value("rackboot_redfish_actions_total", failed) == 1


def test_plain_http_needs_the_bmcs_consent(tmp_path):
    """A redfish+http address to a BMC not marked plain_http: refused before connecting
    (the port is closed: an attempt would say unreachable instead)."""
    plugin = configured(bmc_toml(tmp_path).replace("BMC7:8443", "127.0.0.1:9"))
    with captured_logs() as logs:
        power = "redfish+http://127.0.0.1:9/redfish/v1/Systems/1"
        assert plugin.provisioning_power(machine=machine(power), action="on") is False
    [line] = [e for e in logs() if e["msg"] == "power action failed"]
    assert line["reason"] == "plain_http"
    assert "does not allow plain HTTP" in line["detail"]


def test_installed_and_called_through_the_provisioning_hook(tmp_path):
    """The entry point loads the plugin; the provisioning plugin's hook reaches it (and it
    loads as well with the provisioning plugin disabled: its hook is optional)."""
    from appliance.loader import ConfigSource, load

    config = tmp_path / "rack.toml"
    config.write_text(bmc_toml(tmp_path))
    _, pm = load(ConfigSource(str(config), False))
    hook = pm.hook.provisioning_power
    with captured_logs() as logs:
        assert (
            hook(machine=machine("redfish://bmc8:443/redfish/v1/Systems/1"), action="on") is False
        )
        assert hook(machine=machine("ipmi://bmc8/1"), action="on") is None
    assert [e["reason"] for e in logs() if e["msg"] == "power action failed"] == ["unknown_bmc"]
    config.write_text('[plugins]\ndisabled = ["provisioning"]\n' + bmc_toml(tmp_path))
    _, pm = load(ConfigSource(str(config), False))
    assert "bmc7:8443" in pm.get_plugin("redfish").bmcs
