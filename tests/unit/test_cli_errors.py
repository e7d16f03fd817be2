"""Every bad input from the operator: the real ``rackboot`` in a subprocess, one
``rackboot: error:`` line on stderr naming what is wrong, and the documented exit code."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from appliance.errors import EXIT_CONFIG, EXIT_OK, EXIT_PLUGIN, EXIT_UNREACHABLE

# Ports no default service uses, so that a node these tests start clashes with nothing.
QUIET = """\
[node]
data_dir = "{data}"
[cluster]
enabled = "off"
[dhcp]
enabled = false
[httpboot]
enabled = false
"""


def env_for(tmp_path: Path, *sites: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RACKBOOT_CONFIG"}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    env["PYTHONPATH"] = os.pathsep.join([*map(str, sites), os.getcwd()])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def rackboot(env: dict[str, str], *args: str, user: list[str] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*user, sys.executable, "-m", "appliance", *args],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def the_error(result: subprocess.CompletedProcess, code: int) -> str:
    """The one error line (after any log lines of a node that began), checked as such."""
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("rackboot: error: ")]
    assert errors == lines[-1:], result.stderr
    return errors[0].removeprefix("rackboot: error: ")


def only_line(result: subprocess.CompletedProcess, code: int) -> str:
    """A command that starts nothing: its stderr is that one line and nothing else."""
    message = the_error(result, code)
    assert result.stderr.count("\n") == 1 and result.stdout == "", result.stderr
    return message


def config_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "rack.toml"
    path.write_text(QUIET.format(data=tmp_path / "data") + textwrap.dedent(extra))
    return path


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- a service that cannot bind --------------------------------------------------


def test_port_in_use_names_address_port_and_reason(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        config = config_file(tmp_path, f'[tftp]\naddresses = ["127.0.0.1"]\nport = {port}\n')
        result = rackboot(env_for(tmp_path), "run", "--config", str(config))
    assert the_error(result, EXIT_PLUGIN) == (
        f"plugin 'tftp': service 'tftp.server' failed to start: 127.0.0.1:{port} (tftp.port): "
        "address already in use (EADDRINUSE: another program or service has it)"
    )


def test_privileged_port_as_a_normal_user_says_what_it_needs():
    with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as fh:
        if int(fh.read()) <= 69:
            pytest.skip("this kernel lets every user bind port 69")
    user = normal_user()
    # A directory the unprivileged user can read and write (pytest's tmp_path is root's 0700).
    with tempfile.TemporaryDirectory(prefix="rackboot-cli-") as top:
        home = Path(top)
        home.chmod(0o777)
        config = config_file(home, '[tftp]\naddresses = ["127.0.0.1"]\nport = 69\n')
        config.chmod(0o644)
        result = rackboot(env_for(home), "run", "--config", str(config), user=user)
    assert the_error(result, EXIT_PLUGIN) == (
        "plugin 'tftp': service 'tftp.server' failed to start: 127.0.0.1:69 (tftp.port): "
        "port 69 needs root or CAP_NET_BIND_SERVICE"
    )


def normal_user() -> list[str]:
    """The command prefix that runs the CLI as a normal user: nothing when this is one,
    setpriv to nobody as root."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv(1) to become a normal user")
    return [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


# -- what `config check` must refuse as `run` does ----------------------------------


@pytest.mark.parametrize("command", ["check", "run"])
def test_tftp_root_that_is_a_file(tmp_path, command):
    config = config_file(tmp_path, f'[tftp]\nport = {free_port()}\nroot = "{tmp_path}/file/sub"\n')
    (tmp_path / "file").write_text("not a directory")
    args = (
        ("config", "check", str(config)) if command == "check" else ("run", "--config", str(config))
    )
    message = only_line(rackboot(env_for(tmp_path), *args), EXIT_CONFIG)
    assert message.startswith(  # the value found is cut at 60 characters
        f"{config}: tftp.root: expected a directory, or a path where one can be created "
        f"({tmp_path}/file is a regular file), found str '/tmp/"
    )
    assert not (tmp_path / "data").exists()  # refused before anything started


def test_two_listeners_on_one_address_and_port(tmp_path):
    config = config_file(tmp_path, '[tftp]\naddresses = ["0.0.0.0", "127.0.0.1"]\nport = 6970\n')
    message = only_line(rackboot(env_for(tmp_path), "config", "check", str(config)), EXIT_CONFIG)
    assert message == (
        f"{config}: tftp.addresses: expected addresses that do not overlap (0.0.0.0 and "
        "127.0.0.1 on UDP port 6970; '0.0.0.0' covers every address)"
    )


def test_two_services_on_one_address_and_port(tmp_path):
    """A third-party plugin declaring its listener, on the port TFTP has."""
    site = fake_distribution(tmp_path, "echo", ECHO_PLUGIN)
    config = config_file(tmp_path, "[tftp]\nport = 6970\n[echo]\nport = 6970\n")
    env = env_for(tmp_path, site)
    for args in (("config", "check", str(config)), ("run", "--config", str(config))):
        message = only_line(rackboot(env, *args), EXIT_CONFIG)
        assert message == (
            f"{config}: tftp.port: expected a UDP port that no other listener of this node "
            "uses on 0.0.0.0 (echo.port listens on 127.0.0.1:6970 too), found int 6970"
        )
    config.write_text(config.read_text().replace("[echo]\nport = 6970", "[echo]\nport = 6971"))
    assert rackboot(env, "config", "check", str(config)).returncode == EXIT_OK


def test_dhcp_and_tftp_on_one_port_are_refused_by_config_check(tmp_path):
    config = config_file(tmp_path, "[tftp]\nport = 6970\n")
    config.write_text(config.read_text().replace("[dhcp]\nenabled = false", "[dhcp]\nport = 6970"))
    message = only_line(rackboot(env_for(tmp_path), "config", "check", str(config)), EXIT_CONFIG)
    assert message == (
        f"{config}: tftp.port: expected a UDP port that no other listener of this node "
        "uses on 0.0.0.0 (dhcp.port listens on 0.0.0.0:6970 too), found int 6970"
    )


HA_PEERS = """\
[ha]
peers = ["0123456789abcdef@192.0.2.2:7471"]
witnesses = ["fedcba9876543210@192.0.2.3:7471"]
"""


def test_ha_peers_without_a_cluster_identity(tmp_path):
    config = config_file(tmp_path, HA_PEERS)
    config.write_text(config.read_text().replace('enabled = "off"', 'enabled = "auto"', 1))
    message = only_line(rackboot(env_for(tmp_path), "config", "check", str(config)), EXIT_CONFIG)
    assert message == (
        f"{config}: ha.peers: expected peers or witnesses only once this node has a cluster "
        f"identity (the election is signed with it; none in {tmp_path}/data/cluster: run "
        "`rackboot cluster init` or `rackboot cluster join TOKEN` first)"
    )


def test_a_normal_user_checking_roots_file_is_not_refused_for_what_it_cannot_see():
    """The cluster identity and the TFTP root live where only root may look: a normal
    user's `config check` cannot know, and must not claim them wrong (nor crash on EACCES)."""
    user = normal_user()
    with tempfile.TemporaryDirectory(prefix="rackboot-cli-") as top:
        home = Path(top)
        home.chmod(0o755)
        (home / "served").symlink_to(home / "data" / "tftp")
        config = config_file(home, HA_PEERS + f'[tftp]\nport = 6970\nroot = "{home}/served"\n')
        config.write_text(config.read_text().replace('enabled = "off"', 'enabled = "auto"', 1))
        config.chmod(0o644)
        (home / "data" / "cluster").mkdir(parents=True, mode=0o700)
        (home / "data" / "tftp").mkdir()
        (home / "data").chmod(0o700)
        if not user:
            (home / "data").chmod(0o000)  # this user owns it: take the permission away
        result = rackboot(env_for(home), "config", "check", str(config), user=user)
        (home / "data").chmod(0o700)
    assert (result.returncode, result.stderr) == (EXIT_OK, ""), result.stderr


@pytest.mark.parametrize("text", ["", "# nothing set yet\n\n"])
def test_a_file_that_sets_nothing_is_said_to(tmp_path, text):
    path = tmp_path / "empty.toml"
    path.write_text(text)
    result = rackboot(env_for(tmp_path), "config", "check", str(path))
    assert (result.returncode, result.stderr) == (EXIT_OK, "")
    assert result.stdout == f"{path}: ok, but it sets nothing: every default applies (15 sections)\n"


# -- configuration paths that are not a readable regular file -----------------------


def test_config_paths_that_are_no_file(tmp_path):
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    os.mkfifo(tmp_path / "fifo")  # no writer: opening it plainly would block for ever
    long = tmp_path / ("x" * 300)
    cases = {
        tmp_path / "loop1": "an existing configuration file (the path is a symbolic link loop)",
        Path("/etc/passwd/x"): (
            "an existing configuration file (a component of the path is not a directory)"
        ),
        long: "a path whose components are at most 255 bytes (a name is too long)",
        tmp_path / "fifo": "a regular file, not a named pipe (FIFO)",
        tmp_path: "a file, not a directory",
        tmp_path / "absent.toml": "an existing configuration file",
    }
    env = env_for(tmp_path)
    for path, expected in cases.items():
        for args in (("config", "check", str(path)), ("run", "--config", str(path))):
            assert only_line(rackboot(env, *args), EXIT_CONFIG) == f"{path}: expected {expected}"


def test_rackboot_config_naming_a_missing_file_is_an_error(tmp_path):
    env = env_for(tmp_path)
    env["RACKBOOT_CONFIG"] = str(tmp_path / "absent.toml")
    for args in (("run",), ("status",), ("plugins", "list")):
        message = only_line(rackboot(env, *args), EXIT_CONFIG)
        assert (
            message
            == f"$RACKBOOT_CONFIG={tmp_path}/absent.toml: expected an existing configuration file"
        )
    assert not (tmp_path / "xdg").exists()  # never the development node


# -- plugins: unknown names, a broken one --------------------------------------------


def test_disabling_an_unknown_plugin(tmp_path):
    env = env_for(tmp_path)
    for args in (("run", "--dev"), ("config", "example"), ("plugins", "list")):
        message = only_line(rackboot(env, *args, "--disable-plugin", "dhpc"), EXIT_CONFIG)
        assert (
            message == "--disable-plugin 'dhpc': no such plugin (installed: dhcp, httpboot, images, provisioning, qemu_power, ra, redfish, relay, tftp)"
        )
    config = tmp_path / "rack.toml"
    config.write_text('[plugins]\ndisabled = ["dhpc"]\n')
    message = only_line(rackboot(env, "config", "check", str(config)), EXIT_CONFIG)
    assert message == (
        f"{config}: plugins.disabled: expected names of installed plugins "
        "(dhcp, httpboot, images, provisioning, qemu_power, ra, redfish, relay, tftp), found str 'dhpc'"
    )


def test_a_broken_plugin_is_listed_and_refused_by_run(tmp_path):
    env = env_for(tmp_path, fake_distribution(tmp_path, "broken", "raise RuntimeError('boom')"))
    error = (
        "plugin 'broken' failed to import: entry point 'broken' (rbt_broken) from "
        "distribution 'rbt-broken': RuntimeError: boom"
    )

    listed = rackboot(env, "plugins", "list")
    assert (listed.returncode, listed.stderr) == (EXIT_OK, "")
    assert (
        f"broken 0.1  (rbt-broken; entry point rackboot.plugins: broken = rbt_broken)\n  BROKEN, not loaded: {error}\n"
        in listed.stdout
    )
    assert "\ntftp " in listed.stdout  # the others are still listed

    status = rackboot(env, "status", "--config", str(config_file(tmp_path)))
    assert status.returncode == EXIT_UNREACHABLE  # loaded, asked the node: none runs
    assert (
        'msg="plugin not loaded" plugin=broken' in status.stderr
        and "RuntimeError: boom" in status.stderr
    )

    for args in (("run", "--dev"), ("config", "example")):
        message = only_line(rackboot(env, *args), EXIT_PLUGIN)
        assert message == (
            f"{error} (disable it with --disable-plugin broken or [plugins] disabled = ['broken'])"
        )
    assert rackboot(env, "config", "example", "--disable-plugin", "broken").returncode == EXIT_OK


ECHO_PLUGIN = """\
from appliance.api import Field, Int, IPv4Address, Section, hookimpl
from appliance.schema import Listener

@hookimpl
def rackboot_config_schema():
    return Section(
        "echo",
        {
            "address": Field(IPv4Address(), default="127.0.0.1", doc="Address."),
            "port": Field(Int(min=0, max=65535), default=7, doc="UDP port."),
        },
        listeners=(Listener("udp", port="port", addresses="address"),),
    )
"""


def fake_distribution(tmp_path: Path, name: str, module: str) -> Path:
    """An installed distribution ``rbt-NAME`` with a ``rackboot.plugins`` entry point
    ``NAME = rbt_NAME``, on a directory the subprocess gets on its PYTHONPATH."""
    site = tmp_path / "site"
    info = site / f"rbt_{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rbt-{name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[rackboot.plugins]\n{name} = rbt_{name}\n")
    (site / f"rbt_{name}.py").write_text(module)
    return site


def test_start_errors_are_described_from_real_os_errors(tmp_path):
    """The mapping the core applies to every service's start failure, on errors the
    kernel really raised."""
    from appliance.errors import describe_os_error

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as second,
            pytest.raises(OSError) as info,
        ):
            second.bind(("127.0.0.1", port))
    in_use = info.value
    reason = "address already in use (EADDRINUSE: another program or service has it)"
    assert describe_os_error(in_use, "127.0.0.1", port, "x.port") == (
        f"127.0.0.1:{port} (x.port): {reason}"
    )
    assert describe_os_error(in_use) == reason  # no declared listener to name
    said = OSError(in_use.errno, f"cannot bind X to 127.0.0.1:{port}: {in_use.strerror}")
    assert describe_os_error(said) == f"{said.strerror} (EADDRINUSE)"
    with pytest.raises(OSError) as info:
        (tmp_path / "absent" / "root").mkdir()
    assert describe_os_error(info.value) == f"{tmp_path}/absent/root: no such file or directory"
