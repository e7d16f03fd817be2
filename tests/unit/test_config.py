"""Configuration: schema validation, error messages naming file/key/expectation, defaults."""

from __future__ import annotations

import ipaddress
import tomllib

import pytest

from appliance.config import disabled_plugins, read_document, validate
from appliance.errors import EXIT_CONFIG, ConfigError
from appliance.pluginmanager import build_plugin_manager, collect_sections
from appliance.schema import (
    REQUIRED,
    Bool,
    Choice,
    Field,
    Float,
    Int,
    IPv4Address,
    IPv4Network,
    List,
    Listener,
    Section,
    Str,
    Table,
    TableList,
    render_example,
    validate_table,
)

SUBNET = Section(
    "dhcp",
    doc="Test section.",
    fields={
        "enabled": Field(Bool(), default=True, doc="On or off."),
        "port": Field(Int(min=1, max=65535), default=67, dev_default=6767, doc="UDP port."),
        "lease": Field(Float(min=1.0), default=3600.0, doc="Lease seconds."),
        "mode": Field(Choice("auth", "proxy"), default="auth", doc="Mode."),
        "server": Field(IPv4Address(), default=None, doc="Optional address."),
        "names": Field(List(Str()), default=(), doc="Names."),
        "subnets": Field(
            TableList(
                {
                    "network": Field(IPv4Network(), example="192.0.2.0/24", doc="Network."),
                    "router": Field(IPv4Address(), default=None, doc="Router."),
                }
            ),
            default=(),
            doc="Subnets.",
        ),
        "probe": Field(
            Table({"timeout": Field(Float(min=0.0), default=0.5)}), default={}, doc="Probe."
        ),
    },
)


def check(document: dict, sections=(SUBNET,), dev=False):
    return validate("rack.toml", document, list(sections), dev=dev)


def test_defaults_and_dev_defaults():
    prod = check({})
    assert prod.dhcp.port == 67 and prod.dhcp.enabled is True and prod.dhcp.server is None
    assert prod.dhcp.probe.timeout == 0.5
    assert check({}, dev=True).dhcp.port == 6767


def test_values_are_converted():
    cfg = check(
        {
            "dhcp": {
                "server": "192.0.2.1",
                "lease": 60,
                "names": ["a", "b"],
                "subnets": [{"network": "192.0.2.0/24", "router": "192.0.2.1"}],
            }
        }
    )
    assert cfg.dhcp.server == ipaddress.IPv4Address("192.0.2.1")
    assert cfg.dhcp.lease == 60.0 and isinstance(cfg.dhcp.lease, float)
    assert cfg.dhcp.names == ("a", "b")
    assert cfg.dhcp.subnets[0].network == ipaddress.IPv4Network("192.0.2.0/24")
    assert cfg.to_plain()["dhcp"]["subnets"] == [{"network": "192.0.2.0/24", "router": "192.0.2.1"}]


@pytest.mark.parametrize(
    ("document", "keypath", "expected", "found"),
    [
        ({"dhcp": {"port": "67"}}, "dhcp.port", "an integer >= 1 and <= 65535", "str '67'"),
        ({"dhcp": {"port": 70000}}, "dhcp.port", "an integer >= 1 and <= 65535", "int 70000"),
        ({"dhcp": {"port": True}}, "dhcp.port", "an integer", "bool True"),
        ({"dhcp": {"enabled": "yes"}}, "dhcp.enabled", "true or false", "str 'yes'"),
        ({"dhcp": {"mode": "relay"}}, "dhcp.mode", "one of 'auth', 'proxy'", "str 'relay'"),
        ({"dhcp": {"server": "300.1.1.1"}}, "dhcp.server", "an IPv4 address", "str '300.1.1.1'"),
        ({"dhcp": {"names": ["a", 3]}}, "dhcp.names[1]", "a string", "int 3"),
        (
            {"dhcp": {"subnets": [{"network": "x"}]}},
            "dhcp.subnets[0].network",
            "an IPv4 network",
            "str 'x'",
        ),
        ({"dhcp": {"subnets": [5]}}, "dhcp.subnets[0]", "a table", "int 5"),
        ({"dhcp": {"probe": {"timeout": -1}}}, "dhcp.probe.timeout", "a number >= 0.0", "int -1"),
        ({"dhcp": 3}, "dhcp", "a table", "int 3"),
    ],
)
def test_wrong_values_name_file_key_expectation_and_value(document, keypath, expected, found):
    with pytest.raises(ConfigError) as info:
        check(document)
    err = info.value
    assert err.exit_code == EXIT_CONFIG
    assert err.keypath == keypath
    message = str(err)
    assert message.startswith(f"rack.toml: {keypath}: expected {expected}")
    assert f"found {found}" in message


def test_unknown_key_and_section_list_what_is_known():
    with pytest.raises(
        ConfigError, match=r"rack.toml: dhcp.prot: expected a known key \(known here: .*port"
    ):
        check({"dhcp": {"prot": 67}})
    with pytest.raises(
        ConfigError, match=r"rack.toml: dhcp.subnets\[0\].gateway: expected a known key"
    ):
        check({"dhcp": {"subnets": [{"network": "192.0.2.0/24", "gateway": "192.0.2.1"}]}})
    with pytest.raises(
        ConfigError, match=r"rack.toml: tftp: expected a known section \(known: dhcp\)"
    ):
        check({"tftp": {}})


def test_disabled_plugin_sections_are_ignored():
    cfg = validate(
        "f", {"tftp": {"anything": 1}}, [SUBNET], dev=False, ignored_sections=frozenset({"tftp"})
    )
    assert "tftp" not in cfg.sections


def test_required_key():
    section = Section("s", {"must": Field(Str())})
    with pytest.raises(ConfigError, match=r"s.must: expected a string \(this key is required\)$"):
        validate("f", {}, [section], dev=False)


def test_settings_are_read_only():
    cfg = check({})
    with pytest.raises(AttributeError):
        cfg.dhcp.port = 1  # type: ignore[misc]
    with pytest.raises(AttributeError, match="no key dhcp.nope"):
        _ = cfg.dhcp.nope
    with pytest.raises(AttributeError, match=r"no configuration section \[nope\]"):
        _ = cfg.nope


def test_read_document_errors(tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match="missing.toml: expected an existing configuration file$"):
        read_document(missing)
    bad = tmp_path / "bad.toml"
    bad.write_text("[node\nname = 1\n")
    with pytest.raises(ConfigError, match=r"bad.toml: expected valid TOML \("):
        read_document(bad)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"name = '\xff'\n")
    with pytest.raises(ConfigError, match="expected UTF-8 text"):
        read_document(binary)
    with pytest.raises(ConfigError, match="expected a file, not a directory"):
        read_document(tmp_path)


def test_plugins_disabled_is_checked_before_loading():
    assert disabled_plugins("f", {"plugins": {"disabled": ["dhcp"]}}) == ("dhcp",)
    assert disabled_plugins("f", {}) == ()
    with pytest.raises(ConfigError, match="f: plugins.disabled: expected a list of plugin names"):
        disabled_plugins("f", {"plugins": {"disabled": "dhcp"}})


def test_example_is_complete_and_valid():
    sections = [*collect_sections(build_plugin_manager(entry_points=[])), SUBNET]
    text = render_example(sections)
    document = tomllib.loads(text)
    assert set(document) == {"node", "plugins", "cluster", "ha", "firmware", "network", "dhcp"}
    assert "# UDP port." in text and "port = 67" in text
    # An optional key with no default is shown commented out, with its expectation.
    assert "# server = <an IPv4 address such as '192.0.2.10'>" in text
    cfg = validate("<example>", document, sections, dev=False)
    assert cfg.dhcp.subnets[0].network == ipaddress.IPv4Network("192.0.2.0/24")


def test_required_field_without_example_is_shown_not_defaulted():
    text = render_example([Section("s", {"must": Field(Int(), default=REQUIRED)})])
    assert "# must = <an integer>" in text


def test_validate_table_reports_nested_path():
    with pytest.raises(ConfigError) as info:
        validate_table({"a": Field(Int())}, {"a": "x"}, "f", "outer.inner", dev=False)
    assert info.value.keypath == "outer.inner.a"


def test_read_document_refuses_what_is_no_regular_file(tmp_path):
    """Stat before reading (a FIFO without a writer: test_cli_errors.py, in a subprocess
    that cannot hang this one); an OS error must not escape as a traceback."""
    with pytest.raises(ConfigError, match=r"expected a regular file, not a character device"):
        read_document("/dev/null")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(ConfigError, match=r"\(the path is a symbolic link loop\)$"):
        read_document(tmp_path / "a")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"\(a component of the path is not a directory\)$"):
        read_document(tmp_path / "file" / "x")
    with pytest.raises(ConfigError, match=r"components are at most 255 bytes"):
        read_document(tmp_path / ("n" * 256))


LISTENING = Section(
    "svc",
    doc="A service that listens.",
    fields={
        "on": Field(Bool(), default=True),
        "addresses": Field(List(IPv4Address()), default=("127.0.0.1",)),
        "port": Field(Int(min=0, max=65535), default=69),
        "admin_port": Field(Int(min=0, max=65535), default=80),
    },
    listeners=(
        Listener("udp", port="port", addresses="addresses", enabled="on"),
        Listener("tcp", port="admin_port", addresses="addresses", enabled="on"),
    ),
)
OTHER = Section(
    "other",
    fields={"listen": Field(IPv4Address(), default="0.0.0.0"), "port": Field(Int(), default=67)},
    listeners=(Listener("udp", port="port", addresses="listen"),),
)
EVERYWHERE = Section(  # binds every address, unless turned 'off'
    "everywhere",
    fields={"mode": Field(Choice("on", "off"), default="on"), "port": Field(Int(), default=53)},
    listeners=(Listener("tcp", port="port", enabled="mode"),),
)


@pytest.mark.parametrize(
    ("document", "refused"),
    [
        ({}, None),
        ({"svc": {"admin_port": 69}}, None),  # TCP and UDP never clash
        ({"other": {"port": 69}}, "svc.port: expected a UDP port that no other listener"),
        ({"other": {"port": 69, "listen": "127.0.0.2"}}, None),
        ({"other": {"port": 69}, "svc": {"on": False}}, None),  # a service turned off
        ({"other": {"port": 0}, "svc": {"port": 0}}, None),  # ephemeral ports
        ({"svc": {"addresses": ["127.0.0.1", "127.0.0.1"]}}, "svc.addresses: expected addresses"),
        ({"everywhere": {"port": 80}}, "everywhere.port: expected a TCP port"),
        ({"everywhere": {"port": 80, "mode": "off"}}, None),
    ],
)
def test_two_listeners_on_one_address_and_port(document, refused):
    sections = [OTHER, LISTENING, EVERYWHERE]
    if refused is None:
        config = validate("f", document, sections, dev=False)
        assert all(entry.port != 0 for entry in config.listening)
        return
    with pytest.raises(ConfigError) as info:
        validate("f", document, sections, dev=False)
    assert str(info.value).startswith(f"f: {refused}")


PEER = "0123456789abcdef@192.0.2.2:7471"
WEB = Section(  # an HTTP service on the replication port
    "web",
    fields={"port": Field(Int(min=0, max=65535), default=7472)},
    listeners=(Listener("tcp", port="port"),),
)


@pytest.mark.parametrize(
    ("document", "refused"),
    [
        ({}, None),  # standalone: neither the election nor replication listens
        ({"ha": {"peers": [PEER]}}, "ha.port + 1: expected a TCP port that no other listener"),
        ({"ha": {"peers": [PEER], "backend": "etcd"}}, None),
        ({"ha": {"witnesses": [PEER]}, "web": {"port": 7471}}, None),  # UDP and TCP
        ({"ha": {"witnesses": [PEER]}}, None),  # no replication without peers
        ({"cluster": {"port": 7472}}, "cluster.port: expected a TCP port that no other listener"),
        ({"cluster": {"port": 7472, "enabled": "off"}}, None),
    ],
)
def test_the_cluster_election_and_replication_ports_are_declared(document, refused):
    from appliance.cluster.schema import SECTION as CLUSTER
    from appliance.ha.schema import SECTION as HA

    sections = [WEB, CLUSTER, HA]
    if refused is None:
        validate("f", document, sections, dev=False)
        return
    with pytest.raises(ConfigError) as info:
        validate("f", document, sections, dev=False)
    assert str(info.value).startswith(f"f: {refused}")
