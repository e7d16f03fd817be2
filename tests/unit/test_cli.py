"""The command line in-process: exit codes and the messages an operator reads."""

from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest

from appliance import __version__
from appliance.cli import main
from appliance.errors import EXIT_CONFIG, EXIT_OK, EXIT_UNREACHABLE


@pytest.fixture(autouse=True)
def fresh_machine(tmp_path, monkeypatch):
    """No /etc/rackboot file and a private data directory, whatever this machine has."""
    from appliance import loader

    monkeypatch.delenv("RACKBOOT_CONFIG", raising=False)
    monkeypatch.setattr(loader, "DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys):
    assert run(capsys, "version") == (EXIT_OK, f"rackboot {__version__}\n", "")


def test_example_passes_check_from_stdin(capsys, monkeypatch):
    code, example, _ = run(capsys, "config", "example")
    assert code == EXIT_OK and "[node]" in example and "[plugins]" in example
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(example.encode())))
    code, out, err = run(capsys, "config", "check", "-")
    assert (code, err) == (EXIT_OK, "")
    assert out.startswith("<stdin>: ok")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[node]\nshutdown_grace = 'soon'\n",
            "node.shutdown_grace: expected a number >= 0.0 and <= 300.0, found str 'soon'",
        ),
        (
            "[node]\nnmae = 'x'\n",
            "node.nmae: expected a known key (known here: control_socket, data_dir, log_exchanges, name, rack, shutdown_grace)",
        ),
        (
            "[nodes]\n",
            "nodes: expected a known section (known: cluster, dhcp, firmware, ha, httpboot, images, network, node, plugins, provisioning, qemu_power, ra, redfish, relay, tftp)",
        ),
        (
            "[node]\ndata_dir = 'relative/dir'\n",
            "node.data_dir: expected an absolute directory path, found str 'relative/dir'",
        ),
        ("[node\n", "expected valid TOML"),
        (
            "[plugins]\ndisabled = 'dhcp'\n",
            "plugins.disabled: expected a list of plugin names, found str 'dhcp'",
        ),
    ],
)
def test_bad_config_exits_2_naming_file_and_key(capsys, tmp_path, text, message):
    path = tmp_path / "rack.toml"
    path.write_text(text)
    code, out, err = run(capsys, "config", "check", str(path))
    assert code == EXIT_CONFIG
    assert out == ""
    assert err.startswith(f"rackboot: error: {path}: ")
    assert message in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_run_with_bad_config_exits_2_before_starting(capsys, tmp_path):
    path = tmp_path / "rack.toml"
    path.write_text("[node]\nrack = 7\n")
    code, _, err = run(capsys, "run", "--config", str(path))
    assert code == EXIT_CONFIG
    assert f"{path}: node.rack: expected a rack name" in err and "found int 7" in err
    assert not (tmp_path / "xdg").exists()  # nothing was started or created


def test_missing_config_file(capsys, tmp_path):
    code, _, err = run(capsys, "config", "check", str(tmp_path / "nope.toml"))
    assert code == EXIT_CONFIG
    assert (
        err
        == f"rackboot: error: {tmp_path / 'nope.toml'}: expected an existing configuration file\n"
    )


def test_status_without_node_exits_4(capsys, tmp_path):
    code, out, err = run(capsys, "status", "--socket", str(tmp_path / "control.sock"))
    assert code == EXIT_UNREACHABLE and out == ""
    assert "no node answers on" in err and "no such socket" in err


def test_plugins_list_json_describes_core(capsys):
    code, out, _ = run(capsys, "plugins", "list", "--json")
    assert code == EXIT_OK
    plugins = {p["name"]: p for p in json.loads(out)}
    assert plugins["core"]["distribution"] == "rackboot"
    assert plugins["core"]["hooks"] == [
        "rackboot_cli_commands",
        "rackboot_config_schema",
        "rackboot_configure",
        "rackboot_control_commands",
        "rackboot_doctor_checks",
        "rackboot_role_changed",
        "rackboot_services",
        "rackboot_status",
    ]


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == EXIT_CONFIG
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


@contextlib.contextmanager
def running_node(tmp_path, **plugins):
    """A real node with ``plugins`` in a thread; yields it, stops it after."""
    import threading

    import trio

    from appliance.node import Node
    from tests.support.plugins import configured

    config, pm = configured(tmp_path, **plugins)
    node = Node(config, pm)
    ready = threading.Event()
    token: list[trio.lowlevel.TrioToken] = []

    async def serve():
        token.append(trio.lowlevel.current_trio_token())
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: node.run(handle_signals=False, task_status=task_status)
            )
            ready.set()

    thread = threading.Thread(target=trio.run, args=(serve,))
    thread.start()
    try:
        assert ready.wait(30)
        yield node
    finally:
        if token:
            trio.from_thread.run_sync(node.request_stop, trio_token=token[0])
        thread.join(30)


def test_plugin_commands_and_metrics_ask_the_running_node(capsys, monkeypatch, tmp_path):
    """A plugin's CLI command reaches its control handler on a real node in a thread."""
    from prometheus_client import Counter

    from appliance import cli
    from appliance.api import CliCommand, hookimpl

    class Inventory:
        @hookimpl
        def rackboot_services(self, node):
            Counter("inventory_lookups", "Lookups", registry=node.metrics)
            return []

        @hookimpl
        def rackboot_control_commands(self, node):
            return {"inv.find": lambda args: {"asked": args}}

    command = CliCommand(
        ("inventory", "find"),
        "find a machine",
        "inv.find",
        render=lambda result: f"asked for {result['asked']['mac']}",
        arguments=((("mac",), {}), (("--all",), {"action": "store_true"})),
    )
    monkeypatch.setattr(cli, "plugin_cli_commands", lambda: [command])
    with running_node(tmp_path, inv=Inventory()) as node:
        sock = ("--socket", node.control_path)
        # stderr carries the node thread's logs too: compare the answers only.
        code, out, _ = run(capsys, "inventory", "find", "aa:bb", *sock)
        assert (code, out) == (EXIT_OK, "asked for aa:bb\n")
        code, out, _ = run(capsys, "inventory", "find", "aa:bb", "--all", "--json", *sock)
        assert json.loads(out) == {"asked": {"mac": "aa:bb", "all": True}}
        code, out, _ = run(capsys, "metrics", *sock)
        assert code == EXIT_OK and "inventory_lookups_total 0.0" in out


def strict_json(text: str):
    """Parse as RFC 8259 JSON: Python's reader accepts NaN and Infinity, others do not."""

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_status_json_is_strict_json(tmp_path):
    """A status holding infinities and NaN (an endless lease, an unknown rate) prints
    them as null, through the control socket and the CLI both."""
    from appliance.api import hookimpl

    class Odd:
        @hookimpl
        def rackboot_status(self, node):
            return {"forever": float("inf"), "never": -float("inf"), "rate": float("nan"),
                    "rows": [1.5, (float("inf"),)]}  # fmt: skip

    import subprocess

    with running_node(tmp_path, odd=Odd()) as node:
        result = subprocess.run(
            [sys.executable, "-m", "appliance", "status", "--json", "--socket", node.control_path],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == EXIT_OK, result.stderr
    assert strict_json(result.stdout)["odd"] == {
        "forever": None,
        "never": None,
        "rate": None,
        "rows": [1.5, [None]],
    }


def test_text_status_prints_empty_maps_as_none():
    from appliance.cli import format_status

    lines = format_status({"core": {"name": "n"}, "ra": {}, "x": {"a": {}, "b": 1}}).splitlines()
    assert "ra: (none)" in lines and "  a: (none)" in lines and "  b: 1" in lines


def test_a_usage_error_is_one_line(capsys):
    from appliance.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["status", "--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "rackboot: error: unrecognized arguments: --bogus"
    )


IMPORTS_PROBE = """
import sys
from appliance.cli import main
try:
    main(sys.argv[1:])
except (SystemExit, Exception):
    pass
print("IMPORTED", " ".join(sorted(sys.modules)))
"""
SERVICE_LIBRARIES = {"trio", "cryptography", "prometheus_client", "msgpack"}


def imported_by(argv: list[str]) -> set[str]:
    """The modules a fresh ``rackboot ARGV`` process imported."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", IMPORTS_PROBE, *argv], capture_output=True,
                         text=True, timeout=60).stdout  # fmt: skip
    lines = [line for line in out.splitlines() if line.startswith("IMPORTED ")]
    assert len(lines) == 1, out
    return set(lines[0].split()[1:])


@pytest.mark.parametrize(
    "argv",
    [
        ["version"],
        ["status", "--socket", "/nonexistent/rackboot.sock"],
        ["config", "--help"],
        ["firmware", "--help"],
        ["doctor", "--help"],
        ["lab", "--help"],
    ],
)
def test_core_commands_import_neither_trio_nor_plugins(argv):
    """The CLI answers at once (issue 21): a core command imports neither trio nor a
    plugin (each costs tenths of a second); a plugin command still finds the plugins'."""
    heavy = imported_by(argv) & (SERVICE_LIBRARIES | {"pluggy", "plugins.dhcp"})
    assert not heavy, heavy


def test_plugin_commands_are_found_when_asked_for(capsys):
    """`rackboot leases --help` needs the dhcp plugin's command: found lazily."""
    with pytest.raises(SystemExit) as exc:
        main(["leases", "--help"])
    assert exc.value.code == 0
    assert "list" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["leases", "list", "--socket", "/nonexistent/rackboot.sock"],
        ["ha", "status", "--socket", "/nonexistent/rackboot.sock"],
        ["image", "--help"],
        ["machines", "list", "--help"],
    ],
)
def test_a_declared_plugin_command_imports_neither_trio_nor_the_plugins(argv):
    """A plugin command whose first word a ``rackboot.cli`` entry point declares imports
    that module alone: no plugin's ``plugin`` module, no trio, cryptography,
    prometheus_client or msgpack (pluggy, for ``appliance.api``, is cheap)."""
    imported = imported_by(argv)
    heavy = imported & SERVICE_LIBRARIES
    heavy |= {m for m in imported if m.startswith("plugins.") and m.endswith(".plugin")}
    assert not heavy, heavy


def _spec(command) -> tuple:
    return (command.words, command.help, command.control, command.timeout,
            repr(command.arguments), command.render)  # fmt: skip


def test_every_plugin_command_is_declared_as_its_plugin_gives_it():
    """What the entry points declare for a first word is exactly what the plugins' hooks
    give for it (a command added to a hook and not declared would be unreachable once its
    word is declared); every command of Rackboot's own plugins is declared."""
    from appliance.cli import declared_cli_commands, plugin_cli_commands

    by_word: dict[str, list] = {}
    for command in plugin_cli_commands():
        by_word.setdefault(command.words[0], []).append(command)
    assert {"leases", "ha", "image", "machines"} <= set(by_word)
    for word, commands in by_word.items():
        declared = declared_cli_commands(word)
        assert declared is not None, f"`rackboot {word}` is not in the rackboot.cli entry points"
        assert sorted(map(_spec, declared), key=repr) == sorted(map(_spec, commands), key=repr)
