"""The ``rackboot`` command. Exit codes are listed in :mod:`appliance.errors` and docs/cli.md.

The CLI answers at once (issue 21): this module imports only what every command
needs. The control client, the configuration loader, the plugins (and through
them trio, cryptography, prometheus_client) are imported by the commands that
use them, and the plugins' CLI commands are collected only when the command
word is not a core one (see :func:`wants_plugin_commands`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from appliance import __version__
from appliance.errors import EXIT_FAILURE, EXIT_OK, AlreadyRunning, RackbootError, Unreachable
from appliance.firmware.commands import add_firmware_commands
from appliance.lab.commands import add_lab_command
from appliance.logs import get_logger, setup_logging
from appliance.rolling.commands import add_roll_command
from appliance.state.commands import add_commands as add_state_commands

if TYPE_CHECKING:
    from appliance.api import CliCommand

log = get_logger("cli")

# The command words build_parser defines itself; a plugin cannot take one of them
# (argparse refuses a second subparser of the same name), so a command line whose
# first word is here never needs the plugins' commands.
CORE_COMMANDS = frozenset(
    ("run", "status", "config", "plugins", "version", "metrics", "cluster", "setup", "witness")
    + ("firmware", "doctor")
    + ("state",)
    + ("lab",)
)
# Entry points naming a first command word's CLI commands (pyproject.toml, docs/plugins.md).
CLI_GROUP = "rackboot.cli"
# Options before the command word that take a value (``--log-level debug``).
_GLOBAL_OPTIONS_WITH_VALUE = ("--log-format", "--log-level")


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, as every other error (docs/cli.md), not a usage block first."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"rackboot: error: {message} (see `{self.prog} --help`)\n")


def build_parser(extra: list[CliCommand] = ()) -> argparse.ArgumentParser:
    parser = _Parser(prog="rackboot", description="Rackboot provisioning appliance")
    parser.add_argument(
        "--log-format", choices=("kv", "json"), default="kv", help="log line format (default kv)"
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="default info",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--config",
            metavar="FILE",
            help="configuration file (default /etc/rackboot/rackboot.toml)",
        )
        p.add_argument("--dev", action="store_true", help="standalone development defaults")
        p.add_argument(
            "--disable-plugin",
            action="append",
            default=[],
            metavar="NAME",
            help="do not load plugin NAME",
        )
        return p

    run = with_config(sub.add_parser("run", help="run the appliance node"))
    run.set_defaults(func=cmd_run)

    status = with_query(
        with_config(sub.add_parser("status", help="show the running node's status"))
    )
    status.set_defaults(func=cmd_status)

    cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    example = cfg_sub.add_parser("example", help="print a complete commented configuration")
    example.add_argument("--disable-plugin", action="append", default=[], metavar="NAME")
    example.set_defaults(func=cmd_config_example)
    check = cfg_sub.add_parser("check", help="validate a configuration file ('-' for stdin)")
    check.add_argument("file", metavar="FILE")
    check.add_argument("--disable-plugin", action="append", default=[], metavar="NAME")
    check.set_defaults(func=cmd_config_check)

    plugins = sub.add_parser("plugins", help="plugin tools")
    plugins_sub = plugins.add_subparsers(dest="plugins_command", metavar="ACTION", required=True)
    plist = with_config(plugins_sub.add_parser("list", help="list loaded plugins"))
    plist.add_argument("--json", action="store_true", help="machine-readable output")
    plist.set_defaults(func=cmd_plugins_list)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=lambda args: print(f"rackboot {__version__}") or EXIT_OK)

    metrics = with_query(with_config(sub.add_parser("metrics", help="print Prometheus metrics")))
    metrics.set_defaults(func=cmd_metrics)
    add_cluster_commands(sub, with_config)
    add_state_commands(sub, with_config, with_query)
    setup = sub.add_parser(
        "setup", help="ask for the settings, write the configuration, create or join the cluster"
    )
    setup.add_argument(
        "--config", metavar="FILE", help="file to write (default /etc/rackboot/rackboot.toml)"
    )
    setup.add_argument(
        "--answers", metavar="FILE", help="answers from a TOML or JSON file (docs/setup.md)"
    )
    setup.add_argument("--no-start", action="store_true", help="do not start the service")
    setup.add_argument(
        "--network-dir", metavar="DIR",
        help="write the systemd-networkd files here (default: only where the system reads "
        "them, as on the images; docs/setup.md)",
    )  # fmt: skip
    setup.set_defaults(func=cmd_setup)
    witness = with_config(
        sub.add_parser(
            "witness", help="run an election witness: votes only, no DHCP, no disk but crl.der"
        )
    )
    witness.add_argument(
        "--listen", metavar="ADDRESS:PORT", help="UDP address (default: [ha] listen and port)"
    )
    witness.set_defaults(func=cmd_witness)
    add_firmware_commands(sub, with_config)
    add_roll_command(sub.choices["firmware"], with_config)
    add_doctor_command(sub, with_config)
    add_lab_command(sub)

    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {(): sub}
    for command in extra:
        for depth in range(1, len(command.words)):
            prefix = command.words[:depth]
            if prefix not in groups:
                group = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                groups[prefix] = group.add_subparsers(metavar="ACTION", required=True)
        p = groups[command.words[:-1]].add_parser(command.words[-1], help=command.help)
        dests = [p.add_argument(*flags, **options).dest for flags, options in command.arguments]
        with_query(with_config(p)).set_defaults(
            func=cmd_plugin, plugin_command=command, plugin_args=dests
        )
    return parser


def with_query(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of a command that asks the running node."""
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--socket", metavar="PATH", help="control socket (default from the configuration)"
    )
    return p


def command_word(argv: list[str]) -> str | None:
    """The first word of the command line that is no global option or its value."""
    words = iter(argv)
    for word in words:
        if word in _GLOBAL_OPTIONS_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def wants_plugin_commands(argv: list[str]) -> bool:
    """Whether parsing ``argv`` needs the plugins' CLI commands: for a plugin command
    and for the top-level help or usage error, which list them; not for a core
    command (loading every plugin imports trio and the rest: ~0.4 s)."""
    return command_word(argv) not in CORE_COMMANDS


def cli_commands_for(argv: list[str]) -> list[CliCommand]:
    """The plugins' CLI commands ``argv`` needs: those its command word's ``rackboot.cli``
    entry points declare (their modules alone imported: ~0.1 s, not the ~0.5 s of every
    plugin), else every loadable plugin's (the top-level help, a plugin that declares
    none)."""
    declared = declared_cli_commands(command_word(argv))
    return plugin_cli_commands() if declared is None else declared


def declared_cli_commands(word: str | None) -> list[CliCommand] | None:
    """The commands of first word ``word`` that the ``rackboot.cli`` entry points of that
    name give (a list of :class:`CliCommand`, or a function returning one); None if none
    does, or one fails to load (loading every plugin then says what is wrong)."""
    if word is None:
        return None
    from importlib.metadata import entry_points

    found = entry_points(group=CLI_GROUP, name=word)
    if not found:
        return None
    commands: list[CliCommand] = []
    for point in found:
        try:
            declared = point.load()
            commands.extend(declared() if callable(declared) else declared)
        except Exception:
            return None
    return [command for command in commands if command.words[0] == word]


def plugin_cli_commands() -> list[CliCommand]:
    """Every loadable plugin's CLI commands; a broken plugin is reported by
    the commands that load it (run, plugins list, status), not here."""
    from appliance.pluginmanager import build_plugin_manager, call_each

    try:
        pm = build_plugin_manager((), keep_broken=True)
        found = call_each(pm, "rackboot_cli_commands")
    except RackbootError:
        return []
    return [command for _, commands in found for command in commands or ()]


def cmd_run(args: argparse.Namespace) -> int:
    import trio

    from appliance.clock import BoottimeClock
    from appliance.loader import load, preflight, resolve_source
    from appliance.node import Node

    source = resolve_source(args.config, args.dev)
    config, pm = load(source, args.disable_plugin)
    preflight(config)
    if source.dev:
        log.warning(
            "standalone development node: loopback only, unprivileged ports, data in the user's directory",
            config=source.path or "<defaults>",
            hint="write /etc/rackboot/rackboot.toml (see `rackboot config example`) for a real rack",
        )
    if config.sets_nothing:
        log.warning(
            "the configuration file sets nothing: every default applies", config=config.source
        )
    node = Node(config, pm)
    trio.run(node.run, clock=BoottimeClock())
    return EXIT_OK


def cmd_witness(args: argparse.Namespace) -> int:
    """An acceptor for the racks of its cluster (appliance/ha/witness.py, docs/ha.md)."""
    import trio

    from appliance.clock import BoottimeClock
    from appliance.ha.witness import Witness, load_identity
    from appliance.loader import load, resolve_source

    config, _ = load(resolve_source(args.config, args.dev), args.disable_plugin)
    ha = config["ha"]
    listen, port = str(ha.listen), ha.port
    if args.listen:
        host, _, text = args.listen.rpartition(":")
        if not host or not text.isdigit():
            raise RackbootError(f"--listen wants ADDRESS:PORT, got {args.listen!r}")
        listen, port = host, int(text)
    identity = load_identity(config.node.data_dir)
    trio.run(Witness(identity, listen, port, ha.lease).run, clock=BoottimeClock())
    return EXIT_OK


def control_path(args: argparse.Namespace) -> str:
    if args.socket is not None:
        return args.socket
    from appliance.loader import node_settings, resolve_source

    node = node_settings(resolve_source(args.config, args.dev))
    return _socket_of(node)


def _socket_of(node: Any) -> str:
    return node.control_socket or f"{node.data_dir}/control.sock"


def load_for_query(args: argparse.Namespace) -> tuple[Any, Any]:
    """The configuration of a command that asks the node or reads its files: a broken
    plugin is left out and named on stderr, so that the operator can still look."""
    from appliance.loader import load, resolve_source

    config, pm = load(resolve_source(args.config, args.dev), args.disable_plugin, keep_broken=True)
    for info in pm.broken.values():
        log.warning("plugin not loaded", plugin=info.name, error=info.error)
    return config, pm


def cmd_metrics(args: argparse.Namespace) -> int:
    from appliance import control

    text = control.call(control_path(args), "metrics")
    print(control.dumps(text) if args.json else text, end="" if not args.json else "\n")
    return EXIT_OK


def add_doctor_command(sub, with_config) -> None:
    doctor = with_query(with_config(sub.add_parser(
        "doctor", help="check the running appliance and its network: PASS/WARN/FAIL lines",
    )))  # fmt: skip
    doctor.add_argument(
        "--dhcp-probe", metavar="IFACE", default="",
        help="send a DHCP DISCOVER on IFACE and list every server that answers (root, scapy)",
    )  # fmt: skip
    doctor.add_argument(
        "--timeout", metavar="SECONDS", type=float, default=3.0,
        help="how long the probe listens for offers (default 3)",
    )  # fmt: skip
    doctor.add_argument(
        "--known-server", metavar="ADDRESS", action="append", default=[],
        help="another DHCP server identifier that belongs on the link (repeatable)",
    )  # fmt: skip
    doctor.add_argument("-v", "--verbose", action="store_true", help="details of passed checks")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """docs/cli.md, "Doctor": the exit code says the worst verdict."""
    import ipaddress

    from appliance.doctor.findings import DoctorOptions
    from appliance.doctor.run import doctor
    from appliance.errors import UsageError

    if not 0.1 <= args.timeout <= 60:
        raise UsageError(f"--timeout wants seconds from 0.1 to 60, got {args.timeout:g}")
    for address in args.known_server:
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            raise UsageError(f"--known-server wants an IPv4 address, got {address!r}") from None
    config, pm = load_for_query(args)
    path = args.socket if args.socket is not None else _socket_of(config.node)
    options = DoctorOptions(args.dhcp_probe, args.timeout, tuple(args.known_server))
    return doctor(config, pm, path, options, json_output=args.json, verbose=args.verbose)


def cmd_plugin(args: argparse.Namespace) -> int:
    from appliance import control

    command = args.plugin_command
    request = {dest: getattr(args, dest) for dest in args.plugin_args}
    result = control.call(control_path(args), command.control, request, timeout=command.timeout)
    print(control.dumps(result, indent=2, sort_keys=True) if args.json else command.render(result))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from appliance import control

    try:
        status = control.call(control_path(args), "status")
    except Unreachable:
        # No node answers: perhaps `run` refused a broken plugin. Say which (only now:
        # loading the plugins is what a status that gets its answer must not pay).
        if args.socket is None:
            load_for_query(args)
        raise
    if args.json:
        print(control.dumps(status, indent=2, sort_keys=True))
    else:
        print(format_status(status))
    return EXIT_OK


def format_status(status: dict[str, Any]) -> str:
    core = status.get("core", {})
    lines = [
        f"node {core.get('name')}  rack {core.get('rack')}  role {core.get('role')}  "
        f"{'ready' if core.get('ready') else 'starting'}  version {core.get('version')}  up {core.get('uptime', 0):.1f}s  pid {core.get('pid')}",
        f"  config {core.get('config')}{' (development defaults)' if core.get('dev') else ''}"
        f"  data {core.get('data_dir')}",
    ]
    for name, state in sorted(core.get("services", {}).items()):
        lines.append(f"  service {name}: {state}")
    lines.extend(format_cluster(core.get("cluster") or {}))
    roll = (core.get("rolling") or {}).get("roll")
    if roll:
        lines.append(f"  roll {roll['id']} to {roll['version']}: {roll['state']}"
                     + (f": {roll['reason']}" if roll.get("reason") else ""))  # fmt: skip
    ha = core.get("ha") or {}
    if ha.get("mode", "standalone") != "standalone":
        from appliance.ha.plugin import render_status

        lines.extend("  ha: " + line.strip() for line in render_status(ha).splitlines())
    for plugin, info in sorted(status.items()):
        if plugin == "core":
            continue
        lines.extend(_format_mapping({plugin: info}, ""))
    return "\n".join(lines)


def _format_mapping(value: dict[str, Any], indent: str) -> list[str]:
    """``key: value`` lines, nested maps indented below their key; an empty map reads
    ``key: (none)`` (a bare ``key:`` looked like a line cut short)."""
    lines = []
    for key, item in value.items():
        if isinstance(item, dict) and item:
            lines.append(f"{indent}{key}:")
            lines.extend(_format_mapping(item, indent + "  "))
        else:
            lines.append(f"{indent}{key}: {'(none)' if item == {} else item}")
    return lines


def cmd_setup(args: argparse.Namespace) -> int:
    from appliance.setup.dialog import cmd_setup as setup_dialog

    return setup_dialog(args)


def cmd_config_example(args: argparse.Namespace) -> int:
    from appliance.loader import plugin_manager
    from appliance.pluginmanager import collect_sections
    from appliance.schema import render_example

    pm = plugin_manager(args.disable_plugin)
    sys.stdout.write(render_example(collect_sections(pm)))
    return EXIT_OK


def cmd_config_check(args: argparse.Namespace) -> int:
    from appliance.loader import ConfigSource, load, preflight

    config, _ = load(ConfigSource(args.file, dev=False), args.disable_plugin)
    preflight(config)
    if config.sets_nothing:
        print(f"{config.source}: ok, but it sets nothing: every default applies", end=" ")
    else:
        print(f"{config.source}: ok", end=" ")
    print(f"({len(config.sections)} sections)")
    return EXIT_OK


def cmd_plugins_list(args: argparse.Namespace) -> int:
    from appliance import control
    from appliance.loader import load, resolve_source

    source = resolve_source(args.config, args.dev)
    _, pm = load(source, args.disable_plugin, keep_broken=True)
    infos = [vars(info) for info in [*pm.infos.values(), *pm.broken.values()]]
    if args.json:
        print(control.dumps(infos, indent=2))
        return EXIT_OK
    for info in infos:
        print(f"{info['name']} {info['version']}  ({info['distribution']}; {info['source']})")
        if info["error"]:
            print(f"  BROKEN, not loaded: {info['error']}")
            print(f"  disable it with --disable-plugin {info['name']} or [plugins] disabled")
            continue
        print(f"  module: {info['module']}")
        print(f"  hooks: {', '.join(info['hooks']) or '-'}")
    for name in pm.disabled:
        print(f"{name}  (disabled)")
    return EXIT_OK


# -- rackboot cluster ... (appliance/cluster, docs/cluster.md) ---------------------


def add_cluster_commands(sub, with_config) -> None:
    cluster = sub.add_parser("cluster", help="cluster membership: init, token, join, remove")
    actions = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    for name, help_text in (
        ("init", "create a new cluster with this node as its CA holder; prints a join token"),
        ("token", "print a new one-time join token (on the CA holder)"),
        ("join", "enrol this node in a cluster with a token from `rackboot cluster token`"),
        ("remove", "revoke a member (node id or name); every member refuses it from then on"),
    ):
        p = with_query(with_config(actions.add_parser(name, help=help_text)))
        if name == "join":
            p.add_argument("token", metavar="TOKEN")
        if name == "remove":
            p.add_argument("node", metavar="NODE")
        p.set_defaults(func=cmd_cluster)


def cmd_cluster(args: argparse.Namespace) -> int:
    """Through the running node (it starts serving at once); without one, on the files directly."""
    from appliance import control

    action = args.cluster_command
    request = {k: getattr(args, k) for k in ("token", "node") if hasattr(args, k)}
    config = None
    if args.socket is not None:
        path = args.socket
    else:
        config, _ = load_for_query(args)
        path = _socket_of(config.node)
    try:
        result = control.call(path, f"cluster.{action}", request, timeout=30)
    except Unreachable:
        if config is None:
            raise
        result = _cluster_offline(config, action, request)
    if args.json:
        print(control.dumps(result, indent=2, sort_keys=True))
    elif action == "init":
        print(
            f"created cluster {result['cluster_id']}; this node is {result['node_id']} (CA holder)"
        )
        print(f"CA fingerprint (SHA-256): {result['ca_fingerprint']}")
        print(f"join token, valid once until {_when(result['expires'])}:")
        print(result["token"])
    elif action == "token":
        print(f"join token, valid once until {_when(result['expires'])}:")
        print(result["token"])
    elif action == "join":
        print(f"joined cluster {result['cluster_id']} as node {result['node_id']}")
    else:
        print(f"removed node {result['node_id']} (revocation list {result['crl']})")
    return EXIT_OK


def _cluster_offline(config: Any, action: str, request: dict[str, Any]) -> dict[str, Any]:
    """No node running: work on <data_dir>/cluster under the node's lock."""
    import fcntl
    import os
    import time

    import trio

    from appliance.cluster import authority
    from appliance.cluster.discovery import local_ipv4_addresses
    from appliance.cluster.files import ClusterFiles
    from appliance.cluster.service import join_cluster

    settings, node = config.cluster, config.node
    if settings.enabled == "off":
        raise RackbootError("[cluster] enabled = 'off' in the configuration")
    os.makedirs(node.data_dir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(node.data_dir, "node.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(f"a node holds {node.data_dir} but does not answer") from None
        files = ClusterFiles(node.data_dir)
        if settings.advertise:
            addresses = [settings.advertise]
        elif str(settings.listen) != "0.0.0.0":
            addresses = [f"{settings.listen}:{settings.port}"]
        else:
            addresses = [f"{a}:{settings.port}" for a in local_ipv4_addresses()]
        now = time.time()
        if action == "init":
            identity = authority.init_cluster(files, node.name, now)
            token = authority.issue_token(files, addresses, settings.token_ttl, now)
            return {
                "cluster_id": identity.cluster_id, "node_id": identity.node_id,
                "ca_fingerprint": identity.ca_fingerprint, "token": token.encode(),
                "expires": token.expires,
            }  # fmt: skip
        if action == "token":
            token = authority.issue_token(files, addresses, settings.token_ttl, now)
            return {"token": token.encode(), "expires": token.expires, "addresses": addresses}
        if action == "join":
            identity = trio.run(join_cluster, files, request["token"], node.name, node.rack)
            return {"cluster_id": identity.cluster_id, "node_id": identity.node_id}
        node_id, crl = authority.revoke(files, request["node"], now)
        return {"node_id": node_id, "crl": crl.number, "revoked": len(crl.serials)}
    finally:
        os.close(fd)


def _when(timestamp: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


def format_cluster(cluster: dict[str, Any]) -> list[str]:
    """The site table of `rackboot status`: every appliance, offline ones too."""
    if cluster.get("state") != "member":
        return [f"  cluster: {cluster.get('state', 'off')}"]
    lines = [
        f"  cluster {cluster['cluster_id']}  node {cluster['node_id']}"
        f"{'  (CA holder)' if cluster.get('ca_holder') else ''}  listen {cluster.get('listen')}"
        f"  mdns {'on' if cluster.get('mdns') else 'off'}  revoked {cluster.get('revoked', 0)}",
        "site:",
        f"  {'NAME':<16} {'RACK':<10} {'ROLE':<8} {'ADDRESS':<22} {'VERSION':<9} "
        f"{'LAST SEEN':<10} HEALTH",
    ]
    for row in cluster.get("site", []):
        ago = row.get("last_seen_ago")
        seen = "now" if row.get("self") else ("never" if ago is None else f"{ago:.1f}s ago")
        health = row.get("health", "?") + (" (this node)" if row.get("self") else "")
        if row.get("health") != "online" and row.get("reason"):
            health += f": {row['reason']}"
        lines.append(
            f"  {(row.get('name') or row.get('node_id') or '?'):<16} {row.get('rack') or '-':<10} "
            f"{row.get('role') or '-':<8} {row.get('address') or '-':<22} "
            f"{row.get('version') or '-':<9} {seen:<10} {health}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(cli_commands_for(words) if wants_plugin_commands(words) else ())
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    try:
        return int(args.func(args) or EXIT_OK)
    except RackbootError as exc:
        print(f"rackboot: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say, and Python must not
        # complain again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # a bug: one line still, the traceback only when asked
        import traceback

        log.debug("unexpected error", traceback=traceback.format_exc())
        print(
            f"rackboot: error: internal error: {type(exc).__name__}: {exc} "
            "(a bug: please report it; --log-level debug shows where)",
            file=sys.stderr,
        )
        return EXIT_FAILURE
