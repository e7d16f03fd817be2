"""The example plugin of docs/examples/rackboot-hello, installed and loaded as a user would.

Each distribution is installed with pip into a throw-away ``--target``
directory and put on ``PYTHONPATH`` of ``python -m appliance`` subprocesses,
so the core finds it through its ``rackboot.plugins`` entry point, exactly as
in production. Nothing is installed into the running environment; state and
control sockets live under ``tmp_path`` (``XDG_DATA_HOME`` for the development
defaults, ``RACKBOOT_CONFIG`` pointing nowhere so /etc/rackboot is never read).
No root and no network needed.

Installing offline: ``pip install --no-deps --no-build-isolation --no-index
--target DIR SRC`` builds the project with the setuptools already installed.
setuptools older than 70.1 needs the separate ``wheel`` package for
``bdist_wheel`` (Python 3.11's venv ships setuptools 65 without it). Where it
is missing, the test builds the wheel itself from what setuptools does produce
without it (``egg_info`` for the metadata and entry points, ``build_py`` for
the files) and installs that wheel with the same pip command.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.errors import EXIT_OK, EXIT_PLUGIN
from tests.support.distributions import pip_install

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "rackboot-hello"

COMMAND_TIMEOUT = 60.0  # any one CLI or pip run
READY_TIMEOUT = 30.0  # from `run` to a status answer with the hello port
STOP_TIMEOUT = 20.0  # from SIGTERM to exit
POLL_INTERVAL = 0.1
MAX_POLLS = 300

HELLO_HOOKS = {
    "hello_greeting",
    "rackboot_addhooks",
    "rackboot_config_schema",
    "rackboot_services",
    "rackboot_status",
}

BROKEN_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "rackboot-broken"
version = "0.0.1"

[project.entry-points."rackboot.plugins"]
broken = "rackboot_broken"

[tool.setuptools]
py-modules = ["rackboot_broken"]
"""
BROKEN_MODULE = 'raise RuntimeError("rackboot_broken is broken on purpose")\n'

# Another plugin implementing the example's own hook. Its entry point name sorts
# before "hello", so it is registered before hello_greeting's spec exists.
CAPS_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "rackboot-caps"
version = "0.2.0"

[project.entry-points."rackboot.plugins"]
caps = "rackboot_caps"

[tool.setuptools]
py-modules = ["rackboot_caps"]
"""
CAPS_MODULE = """\
from appliance.api import hookimpl


@hookimpl
def hello_greeting(node, peer):
    host = peer.rsplit(":", 1)[0]
    return node.config["hello"].greeting.upper() + "\\nto " + host
"""


# -------------------------------------------------------------------------
# Installing a distribution into a directory, offline
# -------------------------------------------------------------------------


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("cwd", REPO)
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False, **kwargs
    )


@pytest.fixture(scope="module")
def hello_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the installed rackboot-hello distribution (once per module)."""
    base = tmp_path_factory.mktemp("hello-install")
    target = base / "site"
    pip_install(EXAMPLE, target, base / "work")
    assert list(target.glob("rackboot_hello-0.1.0.dist-info"))
    return target


def install_generated(tmp_path: Path, name: str, pyproject: str, modules: dict[str, str]) -> Path:
    """Write a throw-away distribution under ``tmp_path`` and install it: its directory."""
    src = tmp_path / f"{name}-src"
    src.mkdir()
    (src / "pyproject.toml").write_text(pyproject)
    for module, text in modules.items():
        (src / f"{module}.py").write_text(text)
    target = tmp_path / f"{name}-site"
    pip_install(src, target, tmp_path / f"{name}-work")
    return target


@pytest.fixture
def broken_site(tmp_path: Path) -> Path:
    """A directory holding a distribution whose plugin module raises at import."""
    return install_generated(
        tmp_path, "broken", BROKEN_PYPROJECT, {"rackboot_broken": BROKEN_MODULE}
    )


@pytest.fixture
def caps_site(tmp_path: Path) -> Path:
    """A directory holding a distribution that overrides the hello greeting."""
    return install_generated(tmp_path, "caps", CAPS_PYPROJECT, {"rackboot_caps": CAPS_MODULE})


# -------------------------------------------------------------------------
# Running the CLI and a node
# -------------------------------------------------------------------------


def cli_env(tmp_path: Path, *sites: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [*(str(site) for site in sites), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")  # development data dir: never the user's
    env.pop("RACKBOOT_CONFIG", None)  # naming a missing file is an error now
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def rackboot(env: dict[str, str], *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "appliance", *args], env=env, **kwargs)


def write_config(tmp_path: Path, greeting: str) -> tuple[Path, Path]:
    """A configuration with its data directory under ``tmp_path``: (file, control socket)."""
    data_dir = tmp_path / "data"
    config = tmp_path / "rackboot.toml"
    config.write_text(
        textwrap.dedent(
            f"""\
            [node]
            name = "hello-test"
            data_dir = {json.dumps(str(data_dir))}
            shutdown_grace = 2.0

            [plugins]
            # The example alone: the built-in protocol plugins would bind real ports.
            disabled = ["dhcp", "tftp", "httpboot"]

            [hello]
            port = 0
            greeting = {json.dumps(greeting)}
            """
        )
    )
    return config, data_dir / "control.sock"


@contextlib.contextmanager
def running_node(
    env: dict[str, str], tmp_path: Path, control: Path, *args: str
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """``python -m appliance run ARGS``, ready: yields (process, first status with the hello port).

    On the way out the process is killed if still running (it is ours: by its PID).
    """
    log_path = tmp_path / "node.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "appliance", "run", *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc, wait_ready(proc, env, control, log_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)


def status(env: dict[str, str], control: Path) -> subprocess.CompletedProcess[str]:
    return rackboot(env, "status", "--json", "--socket", str(control))


def wait_ready(
    proc: subprocess.Popen[bytes], env: dict[str, str], control: Path, log_path: Path
) -> dict[str, Any]:
    """Poll ``status`` until the hello service reports its port: bounded in time and count."""
    deadline = time.monotonic() + READY_TIMEOUT
    last = ""
    for _ in range(MAX_POLLS):
        if proc.poll() is not None:
            pytest.fail(f"node exited {proc.returncode} before ready:\n{log_path.read_text()}")
        answer = status(env, control)
        if answer.returncode == EXIT_OK:
            result = json.loads(answer.stdout)
            if result.get("hello", {}).get("port") and result["core"]["role"] == "active":
                return result
        last = answer.stdout + answer.stderr
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_INTERVAL)
    pytest.fail(f"node not ready in {READY_TIMEOUT} s; last status: {last}\n{log_path.read_text()}")


def read_greeting(port: int) -> bytes:
    """Connect to the hello service and read until it closes (bounded)."""
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        for _ in range(64):
            chunk = conn.recv(4096)
            if not chunk:
                return data
            data += chunk
    pytest.fail(f"the hello service did not close the connection; got {data!r}")


def stop(proc: subprocess.Popen[bytes], log_path: Path) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"node did not stop within {STOP_TIMEOUT} s of SIGTERM")
    log = log_path.read_text()
    assert code == EXIT_OK, log
    assert "Traceback" not in log, log
    return log


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -------------------------------------------------------------------------
# The tests
# -------------------------------------------------------------------------


def test_plugins_list_shows_the_entry_point_plugin(hello_site: Path, tmp_path: Path) -> None:
    listed = rackboot(cli_env(tmp_path, hello_site), "plugins", "list", "--json")
    assert listed.returncode == EXIT_OK, listed.stderr
    plugins = {info["name"]: info for info in json.loads(listed.stdout)}
    assert {"core", "hello"} <= set(plugins)  # beside the built-in ones
    hello = plugins["hello"]
    assert hello["version"] == "0.1.0"
    assert canonical(hello["distribution"]) == "rackboot-hello"
    assert hello["module"] == "rackboot_hello.plugin"
    assert hello["source"] == "entry point rackboot.plugins: hello = rackboot_hello.plugin"
    # Its own hookspec (hello_greeting) included: rackboot_addhooks registered it.
    assert set(hello["hooks"]) == HELLO_HOOKS
    assert not (tmp_path / "xdg").exists()  # listing plugins creates no state


def test_config_example_has_the_hello_section(hello_site: Path, tmp_path: Path) -> None:
    env = cli_env(tmp_path, hello_site)
    example = rackboot(env, "config", "example")
    assert example.returncode == EXIT_OK, example.stderr
    text = example.stdout
    section = text[text.index("\n[hello]\n") :]
    assert "port = 0" in section
    assert 'greeting = "hello from rackboot"' in section
    assert "# (declared by plugin 'hello')" in text
    # The rendered example is a valid configuration as it is.
    checked = rackboot(env, "config", "check", "-", input=text)
    assert checked.returncode == EXIT_OK, checked.stderr


def test_node_serves_the_greeting_and_stops_on_sigterm(hello_site: Path, tmp_path: Path) -> None:
    env = cli_env(tmp_path, hello_site)
    config, control = write_config(tmp_path, "hi from the example test")
    with running_node(env, tmp_path, control, "--config", str(config)) as (proc, ready):
        assert ready["core"]["services"]["hello.greeter"] == "running"
        assert ready["hello"]["address"] == "127.0.0.1"
        assert ready["hello"]["connections"] == 0
        port = ready["hello"]["port"]

        assert read_greeting(port) == b"hi from the example test\n"
        assert read_greeting(port) == b"hi from the example test\n"

        after = status(env, control)
        assert after.returncode == EXIT_OK, after.stderr
        assert json.loads(after.stdout)["hello"] == {
            "address": "127.0.0.1",
            "port": port,
            "connections": 2,
        }
        log = stop(proc, tmp_path / "node.log")
    assert "hello" in log and "listening" in log
    assert not control.exists()
    with pytest.raises(OSError):  # the port is closed with the node
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_broken_plugin_is_named_and_can_be_disabled(
    hello_site: Path, broken_site: Path, tmp_path: Path
) -> None:
    env = cli_env(tmp_path, hello_site, broken_site)
    reason = "RuntimeError: rackboot_broken is broken on purpose"

    error = (
        "plugin 'broken' failed to import: entry point 'broken' "
        f"(rackboot_broken) from distribution 'rackboot-broken': {reason}"
    )
    # The operator can still list the plugins to find the broken one ...
    listed = rackboot(env, "plugins", "list")
    assert listed.returncode == EXIT_OK, (listed.stdout, listed.stderr)
    assert "BROKEN, not loaded" in listed.stdout and reason in listed.stdout, listed.stdout
    # ... but no node runs with it, and the refusal says how to leave it out.
    failed = rackboot(env, "run", "--dev")
    assert failed.returncode == EXIT_PLUGIN, (failed.stdout, failed.stderr)
    assert failed.stdout == ""
    error_lines = [line for line in failed.stderr.splitlines() if "error" in line]
    assert error and error in error_lines[-1] and "--disable-plugin broken" in error_lines[-1], (
        failed.stderr
    )
    assert "Traceback" not in failed.stderr
    assert not (tmp_path / "xdg").exists()  # the node never started

    listed = rackboot(env, "plugins", "list", "--disable-plugin", "broken")
    assert listed.returncode == EXIT_OK, listed.stderr
    assert listed.stdout.splitlines()[0].startswith("core ")
    assert "hello 0.1.0  (rackboot-hello; " in listed.stdout
    assert listed.stdout.splitlines()[-1] == "broken  (disabled)"

    config, control = write_config(tmp_path, "still greeting")
    run_args = ("--config", str(config), "--disable-plugin", "broken")
    with running_node(env, tmp_path, control, *run_args) as (proc, ready):
        assert "hello" in ready and "dhcp" not in ready
        assert read_greeting(ready["hello"]["port"]) == b"still greeting\n"
        stop(proc, tmp_path / "node.log")


def test_another_plugin_overrides_the_greeting(
    hello_site: Path, caps_site: Path, tmp_path: Path
) -> None:
    env = cli_env(tmp_path, caps_site, hello_site)
    listed = rackboot(env, "plugins", "list", "--json")
    assert listed.returncode == EXIT_OK, listed.stderr
    plugins = {info["name"]: info for info in json.loads(listed.stdout)}
    assert plugins["caps"]["hooks"] == ["hello_greeting"]
    assert set(plugins["hello"]["hooks"]) == HELLO_HOOKS

    config, control = write_config(tmp_path, "hi from caps")
    with running_node(env, tmp_path, control, "--config", str(config)) as (proc, ready):
        # The first non-None answer wins, and the service keeps it to one line.
        assert read_greeting(ready["hello"]["port"]) == b"HI FROM CAPS to 127.0.0.1\n"
        stop(proc, tmp_path / "node.log")
